//! Tests of `prompts`: every built-in file parses and is consistent (ids unique, tools
//! defined, both kinds of tool prompts present), the logprob texts hold ≥ 2,000 tokens by a
//! tokenizer-free lower bound, and bad data gives errors naming the line (the long-context
//! haystack is tested in samewise-longctx).

use std::collections::HashSet;

use super::*;

#[test]
fn pretoken_bound_hand_values() {
    assert_eq!(pretoken_lower_bound(""), 0);
    assert_eq!(pretoken_lower_bound("Hello, world!"), 2);
    assert_eq!(pretoken_lower_bound("it's 2024-03-17"), 2 + 3);
    assert_eq!(pretoken_lower_bound("abc123def"), 3);
    assert_eq!(pretoken_lower_bound("über naïve"), 2);
}

#[test]
fn logprob_texts_are_varied_and_large_enough() {
    let texts = builtin_logprob_texts().unwrap();
    assert!(texts.len() >= 10);
    let ids: HashSet<&str> = texts.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids.len(), texts.len(), "ids must be unique");
    let bound: usize = texts.iter().map(|t| pretoken_lower_bound(&t.text)).sum();
    // ≥ 2,000 tokens guaranteed for the GPT-2/Llama-3 tokenizer family
    assert!(bound >= 2000, "only {bound} tokens guaranteed");
    assert!(texts.iter().all(|t| !t.text.trim().is_empty()));
}

#[test]
fn completion_prompts_parse() {
    let p = builtin_completion_prompts().unwrap();
    assert!(p.len() >= 25, "the samples probe uses 25 prompts");
    let ids: HashSet<&str> = p.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids.len(), p.len());
    assert!(p.iter().all(|x| x.max_tokens > 0 && !x.prompt.is_empty()));
}

#[test]
fn tool_prompts_are_consistent_with_definitions() {
    let defs = builtin_tools().unwrap();
    let prompts = builtin_tool_call_prompts().unwrap();
    let calls = prompts
        .iter()
        .filter(|p| p.expect == ToolExpectation::Call)
        .count();
    let none = prompts
        .iter()
        .filter(|p| p.expect == ToolExpectation::NoCall)
        .count();
    assert!(calls >= 5 && none >= 5, "{calls} call / {none} no-call");
    for p in &prompts {
        let tools = defs.select(&p.tools).unwrap();
        assert!(!tools.is_empty(), "{}", p.id);
        assert!(!p.messages.is_empty());
        if p.expect == ToolExpectation::Call {
            let name = p.expected_name.as_deref().unwrap();
            assert!(
                p.tools.iter().any(|t| t == name),
                "{}: {name} not offered",
                p.id
            );
            let args = p.expected_arguments.as_ref().unwrap();
            // the expected arguments carry every required parameter of the schema
            let def = tools.iter().find(|t| t.function.name == name).unwrap();
            let params = def.function.parameters.as_ref().unwrap();
            for req in params["required"].as_array().unwrap() {
                assert!(
                    args.get(req.as_str().unwrap()).is_some(),
                    "{}: missing {req}",
                    p.id
                );
            }
        }
    }
    assert!(defs.select(&["nope".to_owned()]).is_err());
}

#[test]
fn bad_data_is_an_error_naming_the_line() {
    let err =
        parse_jsonl::<LogprobText>("{\"id\":\"a\",\"text\":\"b\"}\n\n{\"id\":1}").unwrap_err();
    assert!(err.to_string().contains("line 3"), "{err}");
    assert!(parse_jsonl::<LogprobText>("{\"id\":\"a\",\"text\":\"b\",\"x\":1}").is_err());
}
