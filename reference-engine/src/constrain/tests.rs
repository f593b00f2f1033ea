//! Unit tests of the automaton: random instances of each schema are accepted byte by byte,
//! random mutations that an independent validator (the `jsonschema` crate) rejects are
//! rejected, masks over a small vocabulary allow tokens that straddle JSON structure, and
//! unsupported keywords are refused by name.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value, json};

use super::*;

/// Schemas covering the supported subset (tool-call-suite and BFCL-like ones included).
pub(crate) fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                "n": {"type": "integer", "minimum": -5, "maximum": 120},
                "x": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 3},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4}, "minItems": 1, "maxItems": 3},
                "note": {"type": ["string", "null"]}},
               "required": ["n", "x", "tags", "note"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                "items": {"type": "array", "items": {"type": "object", "properties": {
                    "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1}},
                    "required": ["sku", "qty"], "additionalProperties": false}, "maxItems": 4},
                "shipping": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                    "address": {"type": "string"}, "express": {"type": "boolean"}}, "required": ["address"], "additionalProperties": false}]}},
               "required": ["items"], "additionalProperties": false}),
        json!({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                 "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": false}},
               "$ref": "#/$defs/node"}),
        json!({"type": "object", "properties": {"mode": {"const": "fast"}, "level": {"enum": [1, 2, 3, null]},
               "extra": {"type": "object"}}, "required": ["mode"]}),
        json!({"type": "array", "items": {"type": "number"}, "maxItems": 5}),
        // an enum wider than the readings a state keeps, with keys that prefix one another
        json!({"type": "object", "properties": {
                "code": {"enum": (0..60).map(|i| format!("c{i}")).collect::<Vec<_>>()},
                "n": {"enum": [1, 12, 123, 1.5, -1, "1", null]}},
               "required": ["code", "n"], "additionalProperties": false}),
    ]
}

/// A random instance of `s` (within the supported subset); `root` resolves `$ref`.
pub(crate) fn instance(s: &Value, root: &Value, rng: &mut StdRng, depth: usize) -> Value {
    let Some(o) = s.as_object() else {
        return json!(null);
    };
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        let target = root
            .pointer(r.trim_start_matches('#'))
            .cloned()
            .unwrap_or(json!({}));
        return instance(&target, root, rng, depth + 1);
    }
    if let Some(vs) = o.get("enum").and_then(Value::as_array) {
        return vs[rng.random_range(0..vs.len())].clone();
    }
    if let Some(v) = o.get("const") {
        return v.clone();
    }
    if let Some(alts) = o.get("anyOf").and_then(Value::as_array) {
        return instance(&alts[rng.random_range(0..alts.len())], root, rng, depth + 1);
    }
    let t = match o.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts[rng.random_range(0..ts.len())]
            .as_str()
            .unwrap_or("null")
            .to_owned(),
        None if depth > 3 => "null".into(),
        None => [
            "string", "integer", "number", "boolean", "null", "object", "array",
        ][rng.random_range(0..7)]
        .into(),
        Some(_) => "null".into(),
    };
    let num = |k: &str| o.get(k).and_then(Value::as_f64);
    match t.as_str() {
        "null" => json!(null),
        "boolean" => json!(rng.random_bool(0.5)),
        "integer" => {
            let lo = num("minimum").unwrap_or(-1000.0) as i64;
            let hi = num("maximum").unwrap_or(lo as f64 + 2000.0) as i64;
            json!(rng.random_range(lo..=hi))
        }
        "number" => {
            let lo = num("minimum")
                .or(num("exclusiveMinimum").map(|v| v + 0.001))
                .unwrap_or(-100.0);
            let hi = num("maximum")
                .or(num("exclusiveMaximum").map(|v| v - 0.001))
                .unwrap_or(lo + 200.0);
            let v: f64 = rng.random_range(lo..=hi);
            let v = (v * 1000.0).round() / 1000.0;
            json!(v.clamp(lo, hi))
        }
        "string" => {
            let min = o.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = o.get("maxLength").and_then(Value::as_u64).unwrap_or(12) as usize;
            let n = rng.random_range(min..=max.max(min));
            let alphabet = [
                'a', 'Z', '0', ' ', '"', '\\', '\n', 'é', '€', '😀', '/', '\u{1}',
            ];
            json!(
                (0..n)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect::<String>()
            )
        }
        "array" => {
            let min = o.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = o
                .get("maxItems")
                .and_then(Value::as_u64)
                .unwrap_or(3)
                .min(3) as usize;
            let n = if depth > 4 {
                min
            } else {
                rng.random_range(min..=max.max(min))
            };
            let items = o.get("items").cloned().unwrap_or(json!({}));
            Value::Array(
                (0..n)
                    .map(|_| instance(&items, root, rng, depth + 1))
                    .collect(),
            )
        }
        _ => {
            let mut out = Map::new();
            let required: Vec<&str> = o
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(props) = o.get("properties").and_then(Value::as_object) {
                for (k, sub) in props {
                    if required.contains(&k.as_str()) || (depth < 4 && rng.random_bool(0.5)) {
                        out.insert(k.clone(), instance(sub, root, rng, depth + 1));
                    }
                }
            }
            if o.get("additionalProperties") != Some(&json!(false))
                && depth < 3
                && rng.random_bool(0.3)
            {
                out.insert(
                    format!("x{}", rng.random_range(0..9)),
                    instance(&json!({}), root, rng, depth + 1),
                );
            }
            Value::Object(out)
        }
    }
}

fn accepts(g: &Grammar, text: &[u8]) -> bool {
    let mut s = g.start();
    s.advance_all(g, text) && s.can_finish(g)
}

fn grammar(schema: &Value) -> Grammar {
    match compile(&Spec::Json {
        schema: Some(schema.clone()),
    }) {
        Ok(g) => g,
        Err(e) => panic!("compile {schema}: {e:?}"),
    }
}

#[test]
fn random_instances_are_accepted_and_invalid_mutations_rejected() {
    let mut rng = StdRng::seed_from_u64(11);
    for schema in schemas() {
        let g = grammar(&schema);
        let validator = jsonschema::validator_for(&schema).expect("the test schema is valid");
        let mut rejected = 0;
        for _ in 0..150 {
            let v = instance(&schema, &schema, &mut rng, 0);
            assert!(
                validator.is_valid(&v),
                "generator made an invalid instance {v} of {schema}"
            );
            let text = serde_json::to_string(&v).expect("serializes");
            assert!(
                accepts(&g, text.as_bytes()),
                "valid instance {text} refused for {schema}"
            );
            // a mutation: delete, insert or replace one byte
            let mut m = text.clone().into_bytes();
            let at = rng.random_range(0..m.len());
            let junk = b"{}[],:\"0-1.eanul \\x"[rng.random_range(0..19)];
            match rng.random_range(0..3) {
                0 => {
                    m.remove(at);
                }
                1 => m.insert(at, junk),
                _ => m[at] = junk,
            }
            let valid = serde_json::from_slice::<Value>(&m).is_ok_and(|mv| validator.is_valid(&mv));
            if !valid {
                rejected += 1;
                assert!(
                    !accepts(&g, &m),
                    "invalid mutation {:?} accepted for {schema}",
                    String::from_utf8_lossy(&m)
                );
            }
        }
        assert!(
            rejected > 50,
            "too few invalid mutations were tried ({rejected})"
        );
    }
}

#[test]
fn json_mode_accepts_objects_only() {
    let g = compile(&Spec::Json { schema: None }).expect("compiles");
    assert!(accepts(
        &g,
        br#"{"a":[1,2.5e3,{"b":null}],"c":"\u00e9x","d":true}"#
    ));
    assert!(!accepts(&g, b"[1]"));
    assert!(!accepts(&g, br#"{"a":}"#));
    assert!(!accepts(&g, br#"{"a":1"#));
    assert!(!accepts(&g, br#"{"a":01}"#));
    assert!(
        !accepts(&g, br#"{"a":"\ud800"}"#),
        "lone surrogate escapes are not produced"
    );
}

#[test]
fn number_bounds_are_enforced_digit_by_digit() {
    let g = grammar(&json!({"type": "integer", "minimum": 10, "maximum": 250}));
    for ok in ["10", "99", "250", "137"] {
        assert!(accepts(&g, ok.as_bytes()), "{ok}");
    }
    for bad in ["9", "251", "-1", "1000", "12.5", "1e2"] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad}");
    }
    // no dead ends: every accepted prefix can be completed
    let mut s = g.start();
    assert!(s.advance(&g, b'2') && s.advance(&g, b'5'));
    assert!(!s.clone().advance(&g, b'1'), "251 is out of range");
    let g = grammar(&json!({"type": "number", "exclusiveMinimum": 0, "maximum": 0.3}));
    assert!(
        accepts(&g, b"0.3") && accepts(&g, b"0.05") && !accepts(&g, b"0") && !accepts(&g, b"0.31")
    );
    assert!(!accepts(&g, b"0.0") && accepts(&g, b"0.01"));
}

#[test]
fn every_number_let_through_is_a_finite_f64() {
    let big = |digits: usize| format!("1{}", "0".repeat(digits - 1));
    let json_mode = compile(&Spec::Json { schema: None }).expect("compiles");
    for schema in [
        json!({"type": "number"}),
        json!({"type": "integer"}),
        json!({}),
    ] {
        let g = grammar(&schema);
        let ok = [big(308), format!("-{}", big(308)), "7".into()];
        for text in &ok {
            assert!(accepts(&g, text.as_bytes()), "{schema}: {text:.20} refused");
        }
        let bad = [big(309), format!("-{}", big(400))];
        for text in &bad {
            assert!(
                !accepts(&g, text.as_bytes()),
                "{schema}: {text:.20} accepted"
            );
        }
    }
    let g = grammar(&json!({"type": "number"}));
    for ok in [
        "1e307",
        "-9.99e307",
        "0.5e308",
        "1E+0000307",
        "2e-99999",
        "1.5e-5",
    ] {
        assert!(accepts(&g, ok.as_bytes()), "{ok} refused");
        assert!(
            serde_json::from_str::<f64>(ok).is_ok_and(f64::is_finite),
            "{ok}"
        );
        let obj = format!(r#"{{"x":{ok}}}"#);
        assert!(
            accepts(&json_mode, obj.as_bytes()),
            "{obj} refused in JSON mode"
        );
    }
    for bad in ["1e308", "1e400", "10e307", "-1e999", "1e99999999999"] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad} accepted");
        let obj = format!(r#"{{"x":{bad}}}"#);
        assert!(
            !accepts(&json_mode, obj.as_bytes()),
            "{obj} accepted in JSON mode"
        );
    }
    // refusing the digit is no dead end: the number can still end there
    let mut s = g.start();
    assert!(s.advance_all(&g, b"1e30") && !s.clone().advance(&g, b'9') && s.can_finish(&g));
}

/// Feeds `bytes` one at a time while they are allowed; after each, the text must be whole or
/// able to go on (no dead end). Whether all were taken.
fn feed_checked(g: &Grammar, st: &mut State, bytes: &[u8]) -> bool {
    for &b in bytes {
        if !st.advance(g, b) {
            return false;
        }
        assert!(
            st.can_continue(g) || st.can_finish(g),
            "dead end after {:?}",
            char::from(b)
        );
    }
    true
}

#[test]
fn nesting_to_the_depth_bound_never_paints_into_a_corner() {
    let tree = json!({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
        "$ref": "#/$defs/node"});
    // each case: an opener repeated as deep as the grammar takes it, then a filler and the
    // closer as often
    type Case<'a> = (Option<Value>, &'a [u8], &'a [u8], &'a [u8]);
    let cases: [Case; 4] = [
        (None, br#"{"k":["#, b"", b"]}"),
        (Some(json!({})), b"[", b"", b"]"),
        (Some(json!({})), br#"{"k":"#, b"1", b"}"),
        (Some(tree), br#"{"v":1,"kids":["#, b"", b"]}"),
    ];
    for (schema, opener, filler, closer) in cases {
        let g = compile(&Spec::Json {
            schema: schema.clone(),
        })
        .expect("compiles");
        let mut st = g.start();
        let mut depth = 0;
        while depth < 100 {
            let mut next = st.clone();
            if !feed_checked(&g, &mut next, opener) {
                break;
            }
            (st, depth) = (next, depth + 1);
        }
        assert!(depth >= 15, "{schema:?}: only {depth} levels");
        assert!(depth < 100, "{schema:?}: no depth bound");
        let close = [filler, &closer.repeat(depth)].concat();
        assert!(
            feed_checked(&g, &mut st, &close) && st.can_finish(&g),
            "{schema:?}: {depth} levels do not close"
        );
    }
    // a schema whose every instance nests without end is refused when it compiles (schema
    // nesting is bounded at 32 levels, `$ref`s included, so only recursion gets there); a
    // chain of required arrays that ends is not
    let chain = |levels: usize| {
        let mut defs = Map::new();
        for i in 0..levels {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(
                format!("d{i}"),
                json!({"type": "array", "minItems": 1, "items": next}),
            );
        }
        defs.insert(format!("d{levels}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    };
    let endless = json!({"$defs": {"n": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/n"}}},
        "$ref": "#/$defs/n"});
    let e = compile(&Spec::Json {
        schema: Some(endless),
    })
    .expect_err("no finite instance");
    assert!(e.0.contains("nested at most 48"), "{e:?}");
    let g = grammar(&chain(14));
    let text = format!("{}7{}", "[".repeat(14), "]".repeat(14));
    assert!(accepts(&g, text.as_bytes()) && !accepts(&g, b"[[[]]]"));
}

#[test]
fn objects_take_keys_in_any_order_once_with_required_ones() {
    let schema = &schemas()[0];
    let g = grammar(schema);
    assert!(accepts(&g, br#"{"unit":"celsius","city":"Oslo"}"#));
    assert!(!accepts(&g, br#"{"unit":"celsius"}"#), "city is required");
    assert!(!accepts(&g, br#"{"city":"a","city":"b"}"#), "duplicate key");
    assert!(
        !accepts(&g, br#"{"city":"a","zip":"b"}"#),
        "additionalProperties false"
    );
    assert!(!accepts(&g, br#"{"city":"a","unit":"kelvin"}"#), "enum");
    let free = grammar(&json!({"type": "object", "properties": {"a": {"type": "integer"}}}));
    assert!(accepts(&free, br#"{"b":"x","a":1}"#));
    assert!(
        !accepts(&free, br#"{"a":"x"}"#),
        "a declared key keeps its schema"
    );
    assert!(!accepts(&free, br#"{"a":1,"a":2}"#));
}

#[test]
fn string_lengths_count_characters() {
    let g = grammar(&json!({"type": "string", "minLength": 2, "maxLength": 3}));
    assert!(accepts(&g, "\"é€\"".as_bytes()));
    assert!(accepts(&g, br#""a\nb""#));
    assert!(!accepts(&g, br#""a""#));
    assert!(!accepts(&g, br#""abcd""#));
    assert!(!accepts(&g, b"\"a\xff\""), "invalid UTF-8");
    assert!(!accepts(&g, b"\"a\x01\""), "raw control character");
}

/// A small vocabulary: every byte, plus tokens that straddle JSON structure.
fn toy_trie() -> TokenTrie {
    let mut toks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [
        "{\"", "\":", "\":\"", "city", "Oslo\"", "\"}", "1}", "celsius", "\",\"", "<eos>",
    ] {
        toks.push(t.as_bytes().to_vec());
    }
    let eos = (toks.len() - 1) as u32;
    let entries: Vec<(&[u8], bool)> = toks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_slice(), i as u32 == eos))
        .collect();
    TokenTrie::new(&entries, &[eos])
}

#[test]
fn masks_allow_every_token_that_keeps_a_valid_prefix() {
    let trie = Arc::new(toy_trie());
    let id = |s: &str| {
        (0..trie.vocab() as u32)
            .find(|&t| trie.token_bytes(t) == s.as_bytes())
            .expect("token exists")
    };
    let eos = (trie.vocab() - 1) as u32;
    let g = Arc::new(grammar(&schemas()[0]));
    let mut m = Matcher::new(Constraint {
        grammar: g,
        trie: Arc::clone(&trie),
    });
    assert!(m.allowed().contains(id("{\"")) && m.allowed().contains(id("{")));
    assert!(!m.allowed().contains(id("\"}")) && !m.allowed().contains(eos));
    // a non-canonical spelling: {"  c i t y ":" Oslo" }
    for t in ["{\"", "c", "i", "t", "y", "\":\"", "Oslo\""] {
        let t = id(t);
        assert!(m.allowed().contains(t), "token {t} refused");
        assert!(m.accept(t));
    }
    assert!(
        m.allowed().contains(id("}"))
            && m.allowed().contains(id(","))
            && !m.allowed().contains(eos)
    );
    assert!(!m.allowed().contains(id("1}")));
    assert!(m.accept(id("}")));
    assert!(m.is_complete());
    let allowed = m.allowed().clone();
    assert_eq!(allowed.len(), 1, "only the stop token remains");
    assert!(allowed.contains(eos));
}

#[test]
fn tool_grammar_forces_declared_calls() {
    let params = schemas()[0].clone();
    let spec = Spec::Tools {
        functions: vec![("get_weather".into(), Some(params)), ("ping".into(), None)],
        parallel: true,
    };
    let g = compile(&spec).expect("compiles");
    let call = |name: &str, args: &str| format!("{CALL_PREFIX}{name}{CALL_MID}{args}{CALL_SUFFIX}");
    let one = call("get_weather", r#"{"city":"Oslo"}"#);
    assert!(accepts(&g, one.as_bytes()));
    assert!(accepts(
        &g,
        format!("{one}{CALL_SEP}{}", call("ping", "{}")).as_bytes()
    ));
    assert!(!accepts(&g, call("pong", "{}").as_bytes()));
    assert!(!accepts(&g, call("ping", r#"{"a":1}"#).as_bytes()));
    assert!(!accepts(&g, b"Sure, here you go"));
    let single = compile(&Spec::Tools {
        functions: vec![("ping".into(), None)],
        parallel: false,
    })
    .expect("compiles");
    assert!(!accepts(
        &single,
        format!("{}{CALL_SEP}{}", call("ping", "{}"), call("ping", "{}")).as_bytes()
    ));
}

#[test]
fn wide_enums_and_long_tool_lists_reach_every_value() {
    // more values than a state keeps readings (MAX_STACKS), sharing long prefixes
    let codes: Vec<String> = (0..300).map(|i| format!("region-{i:03}")).collect();
    let g = grammar(&json!({"type": "string", "enum": codes}));
    let mut st = g.start();
    assert!(st.advance_all(&g, b"\"region-"));
    assert_eq!(st.readings(), 1, "one reading follows every value");
    for c in &codes {
        assert!(
            accepts(&g, format!("\"{c}\"").as_bytes()),
            "{c} unreachable"
        );
    }
    for bad in ["region-300", "region-00", "region-0000", "region"] {
        assert!(!accepts(&g, format!("\"{bad}\"").as_bytes()), "{bad}");
    }
    // keys that prefix one another (numbers), mixed types, duplicates, inside structures
    let values = json!([1, 12, 123, 1.5, -1, "1", null, true, {"a": [1]}, [1, 2], 12, 0]);
    let g = grammar(&json!({"enum": values}));
    for ok in [
        "1",
        "12",
        "123",
        "1.5",
        "-1",
        "\"1\"",
        "null",
        "true",
        r#"{"a":[1]}"#,
        "[1,2]",
        "0",
    ] {
        assert!(accepts(&g, ok.as_bytes()), "{ok}");
    }
    for bad in [
        "2", "1.", "124", "1234", "01", "\"12\"", "tru", "[1]", "1.50",
    ] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad}");
    }
    let g = grammar(&json!({"type": "array", "items": {"enum": [1, 12, 123]}}));
    assert!(accepts(&g, b"[1,12,123,1]") && accepts(&g, b"[123,12]"));
    assert!(!accepts(&g, b"[13]") && !accepts(&g, b"[1,]"));
    let g = grammar(
        &json!({"type": "object", "properties": {"k": {"enum": [1, 12]},
        "s": {"enum": ["a", "ab"]}}, "required": ["k", "s"], "additionalProperties": false}),
    );
    assert!(accepts(&g, br#"{"k":12,"s":"a"}"#) && accepts(&g, br#"{"s":"ab","k":1}"#));
    assert!(!accepts(&g, br#"{"k":123,"s":"a"}"#));
    // 128 tools (OpenAI's most), names sharing prefixes; the last as reachable as the first
    let functions: Vec<(String, Option<Value>)> = (0..128)
        .map(|i| {
            let p = json!({"type": "object", "properties": {format!("arg{i}"): {"type": "integer"}},
                "required": [format!("arg{i}")], "additionalProperties": false});
            (format!("get_item_{i}"), Some(p))
        })
        .collect();
    let g = compile(&Spec::Tools {
        functions: functions.clone(),
        parallel: true,
    })
    .expect("compiles");
    let call = |name: &str, args: &str| format!("{CALL_PREFIX}{name}{CALL_MID}{args}{CALL_SUFFIX}");
    for i in [0, 1, 12, 31, 32, 33, 100, 127] {
        let one = call(&format!("get_item_{i}"), &format!(r#"{{"arg{i}":7}}"#));
        assert!(accepts(&g, one.as_bytes()), "tool {i} unreachable");
        let two = format!("{one}{CALL_SEP}{}", call("get_item_5", r#"{"arg5":1}"#));
        assert!(accepts(&g, two.as_bytes()), "tool {i}, then another");
        // each function keeps its own arguments
        let wrong = call(&format!("get_item_{i}"), r#"{"arg999":7}"#);
        assert!(
            !accepts(&g, wrong.as_bytes()),
            "tool {i} with another's arguments"
        );
    }
    assert!(!accepts(
        &g,
        call("get_item_128", r#"{"arg128":7}"#).as_bytes()
    ));
    // a name given twice takes either declaration's arguments
    let twice = compile(&Spec::Tools {
        functions: vec![
            ("f".into(), Some(json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))),
            ("f".into(), None),
        ],
        parallel: false,
    })
    .expect("compiles");
    assert!(accepts(&twice, call("f", r#"{"a":1}"#).as_bytes()));
    assert!(accepts(&twice, call("f", "{}").as_bytes()));
}

#[test]
fn a_switch_reads_one_key_then_that_keys_node() {
    let mut g = Grammar::new();
    let one = g.push(Node::Lit((*b"1").into()));
    let two = g.push(Node::Lit((*b"2").into()));
    let key = |k: &[u8]| -> Box<[u8]> { k.into() };
    // "a" twice (either node follows), "ab" a longer key, "" a bare node
    g.root = g.switch(vec![
        (key(b"a"), one),
        (key(b"ab"), two),
        (key(b""), two),
        (key(b"a"), two),
    ]);
    g.seal();
    for ok in ["a1", "a2", "ab2", "2"] {
        assert!(accepts(&g, ok.as_bytes()), "{ok}");
    }
    for bad in ["ab1", "a", "ab", "b2", "1", "", "a12"] {
        assert!(!accepts(&g, bad.as_bytes()), "{bad}");
    }
}

#[test]
fn tool_arguments_are_closed_where_json_schema_leaves_them_open() {
    // BFCL's shape: properties with descriptions, no additionalProperties, a free-form dict
    let params = json!({"type": "object", "properties": {
        "base": {"type": "integer", "description": "The base."},
        "opts": {"type": "object", "description": "anything"}},
        "required": ["base"]});
    let call = |args: &str| format!("{CALL_PREFIX}area{CALL_MID}{args}{CALL_SUFFIX}");
    let tools = compile(&Spec::Tools {
        functions: vec![("area".into(), Some(params.clone()))],
        parallel: false,
    })
    .expect("compiles");
    assert!(accepts(&tools, call(r#"{"base":10}"#).as_bytes()));
    // the free-form dict (no properties) stays open
    assert!(accepts(
        &tools,
        call(r#"{"base":10,"opts":{"x":[1]}}"#).as_bytes()
    ));
    // an undeclared argument is refused: the call is what the function declares
    assert!(!accepts(
        &tools,
        call(r#"{"type":{},"base":10}"#).as_bytes()
    ));
    assert!(!accepts(
        &tools,
        call(r#"{"base":10,"unit":"cm"}"#).as_bytes()
    ));
    // response formats follow JSON Schema: absent additionalProperties is open
    let g = grammar(&params);
    assert!(accepts(&g, br#"{"base":10,"unit":"cm"}"#));
    // and an explicit `true` keeps tool arguments open too
    let mut open = params;
    open["additionalProperties"] = json!(true);
    let tools = compile(&Spec::Tools {
        functions: vec![("area".into(), Some(open))],
        parallel: false,
    })
    .expect("compiles");
    assert!(accepts(
        &tools,
        call(r#"{"base":10,"unit":"cm"}"#).as_bytes()
    ));
}

#[test]
fn unsupported_keywords_are_named() {
    for (schema, kw) in [
        (json!({"type": "string", "pattern": "^a"}), "pattern"),
        (json!({"type": "string", "format": "date"}), "format"),
        (json!({"oneOf": [{"type": "string"}]}), "oneOf"),
        (json!({"type": "number", "multipleOf": 2}), "multipleOf"),
        (
            json!({"type": "object", "patternProperties": {}}),
            "patternProperties",
        ),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
    ] {
        let e = compile(&Spec::Json {
            schema: Some(schema),
        })
        .expect_err("refused");
        assert!(e.0.contains(&format!("\"{kw}\"")), "{e:?} should name {kw}");
    }
    let ok = json!({"type": "object", "title": "t", "description": "d", "properties": {"a": {"type": "string", "default": "x"}}});
    assert!(compile(&Spec::Json { schema: Some(ok) }).is_ok());
    let deep = (0..40).fold(
        json!({"type": "string"}),
        |s, _| json!({"type": "array", "items": s}),
    );
    assert!(
        compile(&Spec::Json { schema: Some(deep) }).is_err(),
        "nesting limit"
    );
}

#[test]
fn the_cache_compiles_once() {
    let cache = GrammarCache::default();
    let spec = Spec::Json {
        schema: Some(schemas()[1].clone()),
    };
    let (a, hit_a) = cache.get(&spec).expect("compiles");
    let (b, hit_b) = cache.get(&spec).expect("compiles");
    assert!(!hit_a && hit_b && Arc::ptr_eq(&a, &b));
}

/// A toy vocabulary with plain text tokens and tokens that straddle string ends.
fn mixed_trie() -> TokenTrie {
    let mut toks: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [
        "ab",
        "Oslo",
        "é",
        "€x",
        "a\"",
        "\":",
        "\",\"",
        "\\n",
        "\\u00",
        "1}",
        "null",
        "celsius\"",
        "x\"}",
        "  ",
        "😀",
        "abcdefgh",
    ] {
        toks.push(t.as_bytes().to_vec());
    }
    toks.push(vec![0xc3]); // half a character
    let entries: Vec<(&[u8], bool)> = toks.iter().map(|t| (t.as_slice(), false)).collect();
    TokenTrie::new(&entries, &[])
}

#[test]
fn masks_equal_the_definition_token_by_token() {
    // the definition: a token is allowed iff its bytes keep the output a valid prefix
    let trie = mixed_trie();
    let mut rng = StdRng::seed_from_u64(5);
    let mut scratch = Vec::new();
    for schema in schemas().into_iter().chain([json!({"type": "object"})]) {
        let g = grammar(&schema);
        for _ in 0..5 {
            let text = serde_json::to_string(&instance(&schema, &schema, &mut rng, 0))
                .expect("serializes");
            let mut state = g.start();
            for &b in text.as_bytes() {
                let mut mask = TokenSet::new(trie.vocab());
                trie.fill_mask(&g, &state, &mut mask, &mut scratch);
                for t in 0..trie.vocab() as u32 {
                    let mut s = state.clone();
                    let ok = s.advance_all(&g, trie.token_bytes(t));
                    assert_eq!(
                        mask.contains(t),
                        ok,
                        "token {:?} after a prefix of {text}",
                        String::from_utf8_lossy(trie.token_bytes(t))
                    );
                }
                assert!(state.advance(&g, b));
            }
        }
    }
}
