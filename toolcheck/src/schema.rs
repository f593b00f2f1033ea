//! Client-supplied JSON Schemas made safe to compile and to run. [`check_size`] bounds a
//! schema's nesting depth and node count before anything compiles it (compiling is then
//! cheap, and nothing recurses deeply on it); [`compile`] builds a validator whose `pattern`
//! and `patternProperties` regexes run on the `regex` crate, in time linear in the input
//! whatever the pattern. A pattern that needs a backtracking engine (backreferences,
//! look-around) does not compile: such a schema cannot be checked, and the caller treats it
//! as it treats any schema that does not compile (see `crate::classify`).
//!
//! (`jsonschema`'s default engine is `fancy-regex`, which backtracks: a client's
//! `^(a+)+\1$` costs it a million steps per string before its backtrack limit gives up, and a
//! given-up match reads as "does not match" — the endpoint's call would be blamed for the
//! client's pattern.)
//!
//! [`check_size`]: crate::schema::check_size
//! [`compile`]: crate::schema::compile

use serde_json::Value;

/// Deepest nesting of JSON values allowed in one schema.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// Most JSON values (objects, arrays and scalars) allowed in the schemas of one request.
pub const MAX_SCHEMA_NODES: usize = 10_000;

/// Why a schema was refused before compiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaTooBig {
    /// Nested deeper than the bound.
    Depth {
        /// The bound.
        max: usize,
    },
    /// More values than the bound (counting from the budget given).
    Nodes {
        /// The bound.
        max: usize,
    },
}

impl SchemaTooBig {
    /// The error code a client is sent.
    pub fn code(self) -> &'static str {
        match self {
            SchemaTooBig::Depth { .. } => "schema_too_deep",
            SchemaTooBig::Nodes { .. } => "schema_too_large",
        }
    }
}

impl std::fmt::Display for SchemaTooBig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchemaTooBig::Depth { max } => write!(f, "the schema is nested more than {max} deep"),
            SchemaTooBig::Nodes { max } => {
                write!(f, "the request's schemas hold more than {max} values")
            }
        }
    }
}

/// Counts `schema`'s values against `budget` (what is left of the request's
/// [`MAX_SCHEMA_NODES`]) and checks its depth against `max_depth`; returns the budget left.
/// Iterative: no recursion, whatever the input.
pub fn check_size(schema: &Value, max_depth: usize, budget: usize) -> Result<usize, SchemaTooBig> {
    let mut left = budget;
    let mut stack: Vec<(&Value, usize)> = vec![(schema, 1)];
    while let Some((v, depth)) = stack.pop() {
        if depth > max_depth {
            return Err(SchemaTooBig::Depth { max: max_depth });
        }
        left = left
            .checked_sub(1)
            .ok_or(SchemaTooBig::Nodes { max: budget })?;
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    Ok(left)
}

/// A validator for `schema` whose regexes run in linear time (see the module doc); the
/// compile error as text otherwise.
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn size_and_depth_bounds() {
        let mut deep = json!({"type": "string"});
        for _ in 0..10 {
            deep = json!({"items": deep});
        }
        // 11 objects and 1 string, 12 deep
        assert_eq!(check_size(&deep, 12, 100), Ok(88));
        assert_eq!(
            check_size(&deep, 11, 100),
            Err(SchemaTooBig::Depth { max: 11 })
        );
        assert_eq!(
            check_size(&deep, 64, 11),
            Err(SchemaTooBig::Nodes { max: 11 })
        );
        assert_eq!(check_size(&json!(1), 1, 1), Ok(0));
        assert_eq!(SchemaTooBig::Depth { max: 1 }.code(), "schema_too_deep");
    }

    #[test]
    fn patterns_run_linear_and_backtracking_ones_do_not_compile() {
        let v = compile(&json!({"type": "string", "pattern": "^(a+)+$"}));
        let Ok(v) = v else {
            panic!("a linear pattern compiles: {v:?}")
        };
        assert!(v.is_valid(&json!("a".repeat(40))));
        assert!(!v.is_valid(&json!(format!("{}!", "a".repeat(40)))));
        assert!(compile(&json!({"pattern": "^(a+)+\\1$"})).is_err());
        assert!(compile(&json!({"pattern": "^(?=a)a$"})).is_err());
        // ECMA-262 classes still work
        let Ok(d) = compile(&json!({"pattern": "^\\d{4}$"})) else {
            panic!("\\d compiles")
        };
        assert!(d.is_valid(&json!("2024")) && !d.is_valid(&json!("20x4")));
    }
}
