//! The customer-suite loader's tests: every check kind loads and scores; every malformed
//! input is refused with its line and field; no input panics (property tests).

use proptest::prelude::*;

use super::*;

fn one(line: &str) -> Result<Suite, String> {
    parse("suite.jsonl", line.as_bytes()).map_err(|e| e.to_string())
}

const MSG: &str = r#""messages": [{"role": "user", "content": "hi"}]"#;

fn line(request_extra: &str, check: &str) -> String {
    format!(r#"{{"request": {{{MSG}{request_extra}}}, "check": {check}}}"#)
}

const TOOLS: &str = r#", "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]"#;

#[test]
fn every_kind_loads_and_scores() {
    let text = [
        line("", r#"{"kind": "exact", "value": " Paris "}"#),
        line("", r#"{"kind": "contains", "value": "paris", "ignore_case": true}"#),
        line("", r#"{"kind": "regex", "pattern": "^\\d{4}$"}"#),
        line(
            r#", "response_format": {"type": "json_object"}"#,
            r#"{"kind": "json_schema", "schema": {"type": "object", "required": ["a"]}}"#,
        ),
        line(
            &format!("{TOOLS}, \"tool_choice\": \"required\""),
            r#"{"kind": "tool_call", "calls": [{"name": "get_weather", "arguments": {"city": ["Paris"], "unit": ["", "c"]}}]}"#,
        ),
        line(TOOLS, r#"{"kind": "tool_call", "calls": []}"#),
    ]
    .join("\n\n");
    let s = one(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.items.len(), 6);
    assert_eq!(s.items[0].id, "line-1");
    assert_eq!(s.items[1].id, "line-3", "blank lines count");
    assert_eq!(s.items[0].request["temperature"], 0);
    assert_eq!(s.items[0].request["max_tokens"], DEFAULT_MAX_TOKENS);
    let sc = |i: usize, text: &str, calls: &[ActualCall]| {
        score(&s.items[i].check, &s.items[i].tools, text, calls).map_err(|(r, _)| r)
    };
    assert_eq!(sc(0, "Paris\n", &[]), Ok(()));
    assert_eq!(sc(0, "paris", &[]), Err("mismatch".into()));
    assert_eq!(sc(1, "It is PARIS.", &[]), Ok(()));
    assert_eq!(sc(1, "Lyon", &[]), Err("missing".into()));
    assert_eq!(sc(2, "2024", &[]), Ok(()));
    assert_eq!(sc(2, "20245", &[]), Err("no_match".into()));
    assert_eq!(sc(3, r#" {"a": 1} "#, &[]), Ok(()));
    assert_eq!(sc(3, r#"{"b": 1}"#, &[]), Err("schema_mismatch".into()));
    assert_eq!(sc(3, "a: 1", &[]), Err("not_json".into()));
    let call = |name: &str, args: &str| ActualCall {
        name: name.into(),
        arguments: args.into(),
    };
    assert_eq!(
        sc(4, "", &[call("get_weather", r#"{"city": "paris"}"#)]),
        Ok(())
    );
    assert_eq!(
        sc(4, "", &[call("get_weather", r#"{"unit": "c"}"#)]),
        Err("missing_required".into())
    );
    assert_eq!(sc(4, "", &[call("nope", "{}")]), Err("wrong_name".into()));
    assert_eq!(sc(4, "", &[]), Err("wrong_count".into()));
    assert_eq!(sc(5, "", &[]), Ok(()));
    // the stored sources load again, ids and all
    let again = from_sources(&s.sources()).unwrap_or_default();
    let ids: Vec<&str> = again.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(
        ids,
        ["line-1", "line-3", "line-5", "line-7", "line-9", "line-11"]
    );
}

#[test]
fn errors_name_the_line_and_the_field() {
    let good = line("", r#"{"kind": "exact", "value": "x"}"#);
    for (bad, want) in [
        (
            line("", r#"{"kind": "regex", "pattern": "("}"#),
            "suite.jsonl:2: check.pattern: invalid regex:",
        ),
        (
            line("", r#"{"kind": "regex", "pattern": "(a)\\1"}"#),
            "suite.jsonl:2: check.pattern: invalid regex:",
        ),
        (
            line("", r#"{"kind": "bleu", "value": "x"}"#),
            "suite.jsonl:2: check.kind: unknown kind \"bleu\"",
        ),
        (
            line("", r#"{"kind": 3}"#),
            "suite.jsonl:2: check.kind: must be a string",
        ),
        (
            line("", r#"{"kind": "exact", "value": 3}"#),
            "suite.jsonl:2: check.value: must be a string",
        ),
        (
            line("", r#"{"kind": "exact"}"#),
            "suite.jsonl:2: check.value: missing",
        ),
        (
            line("", r#"{"kind": "exact", "value": "x", "pattern": "y"}"#),
            "suite.jsonl:2: check.pattern: unknown field",
        ),
        (
            line("", r#"{"kind": "contains", "value": "x", "ignore_case": "yes"}"#),
            "suite.jsonl:2: check.ignore_case: must be true or false",
        ),
        (
            line("", r#"{"kind": "json_schema", "schema": {"type": 7}}"#),
            "suite.jsonl:2: check.schema: does not compile",
        ),
        (
            line("", r#"{"kind": "tool_call", "calls": []}"#),
            "suite.jsonl:2: request.tools: a tool_call check needs tools",
        ),
        (
            line(
                TOOLS,
                r#"{"kind": "tool_call", "calls": [{"name": "other"}]}"#,
            ),
            "suite.jsonl:2: check.calls[0].name: \"other\" is not among request.tools",
        ),
        (
            line(
                TOOLS,
                r#"{"kind": "tool_call", "calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}"#,
            ),
            "suite.jsonl:2: check.calls[0].arguments.city: must be a non-empty array",
        ),
        (
            line(", \"max_tokens\": 0", r#"{"kind": "exact", "value": "x"}"#),
            "suite.jsonl:2: request.max_tokens: must be an integer",
        ),
        (
            line(", \"max_tokens\": \"8\"", r#"{"kind": "exact", "value": "x"}"#),
            "suite.jsonl:2: request.max_tokens: must be an integer",
        ),
        (
            line(", \"temperature\": 1", r#"{"kind": "exact", "value": "x"}"#),
            "suite.jsonl:2: request.temperature: unknown field",
        ),
        (
            line(", \"tool_choice\": \"required\"", r#"{"kind": "exact", "value": "x"}"#),
            "suite.jsonl:2: request.tool_choice: no tools are offered",
        ),
        (
            line(
                ", \"response_format\": {\"type\": \"yaml\"}",
                r#"{"kind": "exact", "value": "x"}"#,
            ),
            "suite.jsonl:2: request.response_format.type: unknown type",
        ),
        (
            r#"{"request": {"messages": []}, "check": {"kind": "exact", "value": "x"}}"#
                .to_owned(),
            "suite.jsonl:2: request.messages: must not be empty",
        ),
        (
            r#"{"request": {"messages": [{"role": "robot", "content": "x"}]}, "check": {"kind": "exact", "value": "x"}}"#.to_owned(),
            "suite.jsonl:2: request.messages[0].role: unknown role",
        ),
        (
            r#"{"request": {"messages": "hi"}, "check": {"kind": "exact", "value": "x"}}"#
                .to_owned(),
            "suite.jsonl:2: request.messages: must be an array",
        ),
        (
            r#"{"check": {"kind": "exact", "value": "x"}}"#.to_owned(),
            "suite.jsonl:2: request: missing",
        ),
        (
            format!(r#"{{"request": {{{MSG}}}}}"#),
            "suite.jsonl:2: check: missing",
        ),
        (
            format!(r#"{{"id": 5, "request": {{{MSG}}}, "check": {{"kind": "exact", "value": "x"}}}}"#),
            "suite.jsonl:2: id: must be a non-empty string",
        ),
        (
            format!(r#"{{"idd": "a", "request": {{{MSG}}}, "check": {{"kind": "exact", "value": "x"}}}}"#),
            "suite.jsonl:2: idd: unknown field",
        ),
        ("[1, 2]".to_owned(), "suite.jsonl:2: an item is a JSON object"),
        ("{\"request\": ".to_owned(), "suite.jsonl:2: not JSON"),
        (
            format!("{}{}", "[".repeat(1000), "]".repeat(1000)),
            "suite.jsonl:2: not JSON",
        ),
    ] {
        let got = one(&format!("{good}\n{bad}\n"))
            .err()
            .unwrap_or_default();
        assert!(got.contains(want), "{bad}\n got: {got}\nwant: {want}");
    }
    // ids are unique
    let dup = format!(
        "{}\n{}",
        good.replacen('{', "{\"id\": \"a\", ", 1),
        good.replacen('{', "{\"id\": \"a\", ", 1)
    );
    assert!(
        one(&dup)
            .err()
            .unwrap_or_default()
            .contains("id used twice")
    );
}

#[test]
fn empty_huge_and_binary_inputs() {
    assert_eq!(one("").map(|s| s.items.len()), Ok(0));
    assert_eq!(one("\n \n\t\n").map(|s| s.items.len()), Ok(0));
    let huge = format!("{{\"id\": \"{}\"}}", "x".repeat(MAX_LINE_BYTES + 1));
    assert!(
        one(&huge)
            .err()
            .unwrap_or_default()
            .contains("suite.jsonl:1: line longer")
    );
    let bytes = [b'{', 0xff, 0xfe, b'}'];
    let e = parse("s", &bytes)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("s:1: not UTF-8"), "{e}");
    // a schema nested past the bound is refused before compiling
    let mut deep = json!({"type": "string"});
    for _ in 0..100 {
        deep = json!({"items": deep});
    }
    let l = line(
        "",
        &json!({"kind": "json_schema", "schema": deep}).to_string(),
    );
    assert!(
        one(&l)
            .err()
            .unwrap_or_default()
            .contains("check.schema: the schema is nested")
    );
    // a missing file names itself
    let e = load(Path::new("/nonexistent/suite.jsonl"))
        .err()
        .map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.contains("/nonexistent/suite.jsonl: cannot open")));
}

proptest! {
    #[test]
    fn no_input_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse("p", &bytes);
    }

    #[test]
    fn no_json_item_panics(s in "[{}\\[\\]\":,a-z0-9 ]{0,200}") {
        let _ = parse("p", s.as_bytes());
        let wrapped = format!(r#"{{"request": {{{MSG}}}, "check": {s}}}"#);
        let _ = parse("p", wrapped.as_bytes());
    }
}
