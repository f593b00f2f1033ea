//! The rules of BFCL's AST checker (Berkeley Function-Calling Leaderboard), for the evals'
//! `tool_calls` suite: one answer's tool calls against an item's ground truth.
//!
//! Categories: simple (exactly one call), multiple (the right function among several
//! offered: also exactly one call), parallel (the same number of calls, matched in any
//! order), irrelevance (no call when no offered tool fits). Per call: the function's name;
//! the arguments parse as a JSON object; every parameter the schema requires is present;
//! no parameter the schema does not declare, nor one the ground truth does not expect; exact
//! types (a bool is not an integer; an integer is accepted where a number is declared;
//! array items are typed too); values among the allowed ones, strings compared after
//! BFCL's normalisation (case, spaces and `,./-_*^` ignored, `'` = `"`), lists
//! order-sensitive, objects key by key. A ground-truth parameter whose allowed values
//! include `""` may be omitted.
//!
//! A failure lands in exactly one [`ErrorType`] bucket, the first rule broken in the order
//! above.
//!
//! [`ErrorType`]: crate::bfcl::ErrorType

use serde_json::{Map, Value};

use crate::ToolCall;

/// What an item tests, which fixes how many calls are right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// One function offered, one call expected.
    Simple,
    /// Several functions offered, one call (to the right one) expected.
    Multiple,
    /// Several calls expected, in any order.
    Parallel,
    /// No offered function fits: no call expected.
    Irrelevance,
}

impl Category {
    /// The data files' name: "simple" | "multiple" | "parallel" | "irrelevance".
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Simple => "simple",
            Category::Multiple => "multiple",
            Category::Parallel => "parallel",
            Category::Irrelevance => "irrelevance",
        }
    }

    /// Parses a data file's name.
    pub fn parse(s: &str) -> Option<Category> {
        match s {
            "simple" => Some(Category::Simple),
            "multiple" => Some(Category::Multiple),
            "parallel" => Some(Category::Parallel),
            "irrelevance" => Some(Category::Irrelevance),
            _ => None,
        }
    }
}

/// The failure buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorType {
    /// Not the expected number of calls (any call at all for irrelevance).
    WrongCount,
    /// A call to another function than expected.
    WrongName,
    /// A required (or expected, not omittable) parameter is absent.
    MissingRequired,
    /// A parameter the schema does not declare or the ground truth does not expect.
    UnexpectedParam,
    /// A value of the wrong JSON type.
    TypeError,
    /// A well-typed value that is not among the allowed ones.
    ValueError,
    /// The arguments are not a JSON object.
    InvalidJson,
}

impl ErrorType {
    /// Every bucket, in reporting order.
    pub const ALL: [ErrorType; 7] = [
        ErrorType::WrongCount,
        ErrorType::WrongName,
        ErrorType::MissingRequired,
        ErrorType::UnexpectedParam,
        ErrorType::TypeError,
        ErrorType::ValueError,
        ErrorType::InvalidJson,
    ];

    /// The bucket's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::WrongCount => "wrong_count",
            ErrorType::WrongName => "wrong_name",
            ErrorType::MissingRequired => "missing_required",
            ErrorType::UnexpectedParam => "unexpected_param",
            ErrorType::TypeError => "type_error",
            ErrorType::ValueError => "value_error",
            ErrorType::InvalidJson => "invalid_json",
        }
    }
}

/// Why an answer failed: the bucket and a line for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The bucket.
    pub error: ErrorType,
    /// What was wrong.
    pub detail: String,
}

/// One expected call: the function and, per parameter, the allowed values.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedCall {
    /// The function's name.
    pub name: String,
    /// Parameter → allowed values (`""` among them: the parameter may be omitted).
    pub args: Map<String, Value>,
}

/// One call as the endpoint returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualCall {
    /// The function's name ("" when the call names none).
    pub name: String,
    /// The arguments as returned (a JSON text).
    pub arguments: String,
}

impl ActualCall {
    /// The calls of a non-streamed chat completion's `message`, read as the gateway and the
    /// probes read them ([`ToolCall::of_message`]): arguments sent as a JSON value rather
    /// than a string are that value's JSON text, a missing name is "".
    pub fn of_message(message: &Value) -> Vec<ActualCall> {
        ToolCall::of_message(message)
            .into_iter()
            .map(|c| ActualCall {
                name: c.name.unwrap_or_default(),
                arguments: c.arguments,
            })
            .collect()
    }
}

fn fail(error: ErrorType, detail: impl Into<String>) -> Failure {
    Failure {
        error,
        detail: detail.into(),
    }
}

/// Checks `actual` against the item: `functions` are the offered tools (OpenAI
/// `{"type":"function","function":{...}}` or bare `{"name","parameters"}` objects),
/// `expected` the ground truth (empty for irrelevance).
pub fn check(
    category: Category,
    functions: &[Value],
    expected: &[ExpectedCall],
    actual: &[ActualCall],
) -> Result<(), Failure> {
    match category {
        Category::Irrelevance => {
            if actual.is_empty() {
                Ok(())
            } else {
                Err(fail(
                    ErrorType::WrongCount,
                    format!("{} call(s) where no tool fits", actual.len()),
                ))
            }
        }
        Category::Simple | Category::Multiple => {
            if actual.len() != 1 || expected.len() != 1 {
                return Err(fail(
                    ErrorType::WrongCount,
                    format!("{} call(s), expected exactly one", actual.len()),
                ));
            }
            check_call(functions, &expected[0], &actual[0])
        }
        Category::Parallel => {
            if actual.len() != expected.len() {
                return Err(fail(
                    ErrorType::WrongCount,
                    format!("{} call(s), expected {}", actual.len(), expected.len()),
                ));
            }
            let mut used = vec![false; actual.len()];
            for e in expected {
                let mut best: Option<Failure> = None;
                let mut matched = false;
                for (i, a) in actual.iter().enumerate() {
                    if used[i] {
                        continue;
                    }
                    match check_call(functions, e, a) {
                        Ok(()) => {
                            used[i] = true;
                            matched = true;
                            break;
                        }
                        // the most specific failure: one from a call to the right function
                        Err(f) => {
                            if best
                                .as_ref()
                                .is_none_or(|b| b.error == ErrorType::WrongName)
                            {
                                best = Some(f);
                            }
                        }
                    }
                }
                if !matched {
                    return Err(best.unwrap_or_else(|| {
                        fail(
                            ErrorType::WrongCount,
                            format!("no call left for {}", e.name),
                        )
                    }));
                }
            }
            Ok(())
        }
    }
}

/// The schema (`parameters`) of `name` among `functions`.
fn schema_of<'a>(functions: &'a [Value], name: &str) -> Option<&'a Value> {
    functions.iter().find_map(|f| {
        let f = f.get("function").unwrap_or(f);
        (f.get("name").and_then(Value::as_str) == Some(name))
            .then(|| f.get("parameters").unwrap_or(&Value::Null))
    })
}

/// One call against one expected call.
pub fn check_call(
    functions: &[Value],
    expected: &ExpectedCall,
    actual: &ActualCall,
) -> Result<(), Failure> {
    if actual.name != expected.name {
        return Err(fail(
            ErrorType::WrongName,
            format!("called {:?}, expected {:?}", actual.name, expected.name),
        ));
    }
    let args: Map<String, Value> = match serde_json::from_str::<Value>(&actual.arguments) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(fail(
                ErrorType::InvalidJson,
                format!("arguments are not an object: {other}"),
            ));
        }
        Err(e) => {
            return Err(fail(
                ErrorType::InvalidJson,
                format!("arguments do not parse: {e}"),
            ));
        }
    };
    let schema = schema_of(functions, &expected.name).unwrap_or(&Value::Null);
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for r in required.iter().filter_map(Value::as_str) {
        if !args.contains_key(r) {
            return Err(fail(
                ErrorType::MissingRequired,
                format!("required parameter {r:?} is missing"),
            ));
        }
    }
    for (k, allowed) in &expected.args {
        let omittable = allowed
            .as_array()
            .is_some_and(|vs| vs.iter().any(|v| v.as_str() == Some("")));
        if !args.contains_key(k) && !omittable {
            return Err(fail(
                ErrorType::MissingRequired,
                format!("expected parameter {k:?} is missing"),
            ));
        }
    }
    for k in args.keys() {
        if !properties.contains_key(k) {
            return Err(fail(
                ErrorType::UnexpectedParam,
                format!("parameter {k:?} is not declared"),
            ));
        }
        if !expected.args.contains_key(k) {
            return Err(fail(
                ErrorType::UnexpectedParam,
                format!("parameter {k:?} is not expected"),
            ));
        }
    }
    for (k, v) in &args {
        let decl = properties.get(k).unwrap_or(&Value::Null);
        if let Err(why) = type_ok(decl, v) {
            return Err(fail(
                ErrorType::TypeError,
                format!("parameter {k:?}: {why}"),
            ));
        }
        let allowed = expected.args.get(k).and_then(Value::as_array);
        let ok = allowed.is_some_and(|vs| vs.iter().any(|a| value_eq(a, v)));
        if !ok {
            return Err(fail(
                ErrorType::ValueError,
                format!(
                    "parameter {k:?} = {v} is not among the allowed {}",
                    expected.args.get(k).unwrap_or(&Value::Null)
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `v` has the declared JSON type (`decl.type`; none declared: anything goes).
fn type_ok(decl: &Value, v: &Value) -> Result<(), String> {
    let Some(ty) = decl.get("type").and_then(Value::as_str) else {
        return Ok(());
    };
    let ok = match ty {
        "integer" => v.is_i64() || v.is_u64(),
        "number" | "float" => v.is_number(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "object" | "dict" => v.is_object(),
        "array" | "tuple" => {
            let Some(items) = v.as_array() else {
                return Err(format!("expected {ty}, got {v}"));
            };
            let item_decl = decl.get("items").unwrap_or(&Value::Null);
            for it in items {
                type_ok(item_decl, it)?;
            }
            true
        }
        "null" => v.is_null(),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("expected {ty}, got {v}"))
    }
}

/// BFCL's string normalisation: lowercase, `'` as `"`, spaces and `,./-_*^` removed.
pub fn normalize(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_whitespace() && !",./-_*^".contains(*c))
        .map(|c| if c == '\'' { '"' } else { c })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Whether the returned `v` equals the allowed value `a` under BFCL's rules.
fn value_eq(a: &Value, v: &Value) -> bool {
    match (a, v) {
        (Value::String(a), Value::String(v)) => normalize(a) == normalize(v),
        (Value::Number(a), Value::Number(v)) => match (a.as_f64(), v.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
        (Value::Array(a), Value::Array(v)) => {
            a.len() == v.len() && a.iter().zip(v).all(|(x, y)| value_eq(x, y))
        }
        (Value::Object(a), Value::Object(v)) => {
            // BFCL: each key of the allowed object holds a list of allowed values
            v.keys().all(|k| a.contains_key(k))
                && a.iter().all(|(k, allowed)| match (v.get(k), allowed) {
                    (Some(x), Value::Array(opts)) => opts.iter().any(|o| value_eq(o, x)),
                    (Some(x), other) => value_eq(other, x),
                    (None, Value::Array(opts)) => opts.iter().any(|o| o.as_str() == Some("")),
                    (None, _) => false,
                })
        }
        (a, v) => a == v,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "scale": {"type": "number"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "integer"}}
            },
            "required": ["city"]}}})
    }

    fn time() -> Value {
        json!({"name": "get_time", "parameters": {"type": "object",
            "properties": {"zone": {"type": "string"}}, "required": ["zone"]}})
    }

    fn exp(name: &str, args: Value) -> ExpectedCall {
        ExpectedCall {
            name: name.to_owned(),
            args: args.as_object().cloned().unwrap_or_default(),
        }
    }

    fn act(name: &str, args: &str) -> ActualCall {
        ActualCall {
            name: name.to_owned(),
            arguments: args.to_owned(),
        }
    }

    fn bucket(r: Result<(), Failure>) -> Option<ErrorType> {
        r.err().map(|f| f.error)
    }

    fn weather_exp() -> ExpectedCall {
        exp(
            "get_weather",
            json!({"city": ["San Francisco", "SF"], "days": [3, ""], "scale": [1.5, ""],
                   "metric": [true, ""], "hours": [[1, 2], ""]}),
        )
    }

    #[test]
    fn simple_accepts_the_right_call_with_normalised_strings() {
        let f = [weather()];
        let e = [weather_exp()];
        for args in [
            r#"{"city": "San Francisco"}"#,
            r#"{"city": "san-francisco", "days": 3}"#,
            r#"{"city": "S.F.", "metric": true, "hours": [1, 2]}"#,
        ] {
            assert_eq!(
                check(Category::Simple, &f, &e, &[act("get_weather", args)]),
                Ok(()),
                "{args}"
            );
        }
    }

    #[test]
    fn count_rules_per_category() {
        let f = [weather(), time()];
        let e = [weather_exp()];
        let good = act("get_weather", r#"{"city": "SF"}"#);
        assert_eq!(
            bucket(check(Category::Simple, &f, &e, &[])),
            Some(ErrorType::WrongCount)
        );
        assert_eq!(
            bucket(check(
                Category::Multiple,
                &f,
                &e,
                &[good.clone(), good.clone()]
            )),
            Some(ErrorType::WrongCount)
        );
        assert_eq!(check(Category::Irrelevance, &f, &[], &[]), Ok(()));
        assert_eq!(
            bucket(check(Category::Irrelevance, &f, &[], &[good])),
            Some(ErrorType::WrongCount)
        );
    }

    #[test]
    fn multiple_needs_the_right_function() {
        let f = [weather(), time()];
        let e = [weather_exp()];
        let r = check(
            Category::Multiple,
            &f,
            &e,
            &[act("get_time", r#"{"zone": "UTC"}"#)],
        );
        assert_eq!(bucket(r), Some(ErrorType::WrongName));
    }

    #[test]
    fn each_rule_has_its_bucket() {
        let f = [weather()];
        let e = [weather_exp()];
        let cases = [
            ("not json", ErrorType::InvalidJson),
            ("[1]", ErrorType::InvalidJson),
            (r#"{"days": 3}"#, ErrorType::MissingRequired),
            (r#"{"city": "SF", "wind": 1}"#, ErrorType::UnexpectedParam),
            (r#"{"city": 7}"#, ErrorType::TypeError),
            (r#"{"city": "SF", "days": true}"#, ErrorType::TypeError),
            (r#"{"city": "SF", "days": 3.0}"#, ErrorType::TypeError),
            (r#"{"city": "SF", "metric": 1}"#, ErrorType::TypeError),
            (r#"{"city": "SF", "hours": [1, "2"]}"#, ErrorType::TypeError),
            (r#"{"city": "Paris"}"#, ErrorType::ValueError),
            (r#"{"city": "SF", "days": 4}"#, ErrorType::ValueError),
            // lists are order-sensitive
            (r#"{"city": "SF", "hours": [2, 1]}"#, ErrorType::ValueError),
        ];
        for (args, want) in cases {
            let r = check(Category::Simple, &f, &e, &[act("get_weather", args)]);
            assert_eq!(bucket(r), Some(want), "{args}");
        }
    }

    #[test]
    fn an_integer_is_a_number_but_not_the_reverse() {
        let f = [weather()];
        let e = [exp("get_weather", json!({"city": ["SF"], "scale": [2.0]}))];
        let r = check(
            Category::Simple,
            &f,
            &e,
            &[act("get_weather", r#"{"city": "SF", "scale": 2}"#)],
        );
        assert_eq!(r, Ok(()));
    }

    #[test]
    fn expected_optional_parameters_may_only_be_omitted_when_allowed() {
        let f = [weather()];
        let e = [exp("get_weather", json!({"city": ["SF"], "days": [3]}))];
        let r = check(
            Category::Simple,
            &f,
            &e,
            &[act("get_weather", r#"{"city": "SF"}"#)],
        );
        assert_eq!(bucket(r), Some(ErrorType::MissingRequired));
        // declared by the schema but not expected by the ground truth
        let e = [exp("get_weather", json!({"city": ["SF"]}))];
        let r = check(
            Category::Simple,
            &f,
            &e,
            &[act("get_weather", r#"{"city": "SF", "days": 3}"#)],
        );
        assert_eq!(bucket(r), Some(ErrorType::UnexpectedParam));
    }

    #[test]
    fn parallel_matches_in_any_order_and_reports_the_specific_error() {
        let f = [weather(), time()];
        let e = [
            exp("get_weather", json!({"city": ["SF"]})),
            exp("get_time", json!({"zone": ["UTC"]})),
        ];
        let w = act("get_weather", r#"{"city": "sf"}"#);
        let t = act("get_time", r#"{"zone": "utc"}"#);
        assert_eq!(
            check(Category::Parallel, &f, &e, &[t.clone(), w.clone()]),
            Ok(())
        );
        assert_eq!(
            check(Category::Parallel, &f, &e, &[w.clone(), t.clone()]),
            Ok(())
        );
        assert_eq!(
            bucket(check(Category::Parallel, &f, &e, std::slice::from_ref(&w))),
            Some(ErrorType::WrongCount)
        );
        let bad_t = act("get_time", r#"{"zone": "CET"}"#);
        assert_eq!(
            bucket(check(Category::Parallel, &f, &e, &[bad_t, w.clone()])),
            Some(ErrorType::ValueError)
        );
        assert_eq!(
            bucket(check(Category::Parallel, &f, &e, &[w.clone(), w])),
            Some(ErrorType::WrongName)
        );
    }

    #[test]
    fn object_values_compare_key_by_key() {
        let f = [json!({"name": "book", "parameters": {"type": "object",
            "properties": {"who": {"type": "object"}}, "required": ["who"]}})];
        let e = [exp(
            "book",
            json!({"who": [{"name": ["Ada"], "age": [36, ""]}]}),
        )];
        let ok = check(
            Category::Simple,
            &f,
            &e,
            &[act("book", r#"{"who": {"name": "ada"}}"#)],
        );
        assert_eq!(ok, Ok(()));
        let bad = check(
            Category::Simple,
            &f,
            &e,
            &[act("book", r#"{"who": {"name": "Bob"}}"#)],
        );
        assert_eq!(bucket(bad), Some(ErrorType::ValueError));
    }

    #[test]
    fn normalisation_follows_bfcl() {
        assert_eq!(normalize("San Francisco, CA"), "sanfranciscoca");
        assert_eq!(normalize("it's"), "it\"s");
        assert_eq!(normalize("A-B_C/D.E*F^G"), "abcdefg");
    }

    proptest! {
        #[test]
        fn parallel_is_order_free(cities in proptest::collection::vec("[a-z]{1,8}", 1..5), rot in 0usize..5) {
            let f = [json!({"name": "w", "parameters": {"type": "object",
                "properties": {"c": {"type": "string"}}, "required": ["c"]}})];
            let e: Vec<_> = cities.iter().map(|c| exp("w", json!({"c": [c]}))).collect();
            let mut a: Vec<_> = cities.iter().map(|c| act("w", &json!({"c": c.to_uppercase()}).to_string())).collect();
            let n = a.len();
            a.rotate_left(rot % n);
            prop_assert_eq!(check(Category::Parallel, &f, &e, &a), Ok(()));
        }

        #[test]
        fn never_panics_and_normalise_is_idempotent(args in ".{0,40}", s in ".{0,20}") {
            let f = [weather()];
            let _ = check(Category::Simple, &f, &[weather_exp()], &[act("get_weather", &args)]);
            prop_assert_eq!(normalize(&normalize(&s)), normalize(&s));
        }
    }
}
