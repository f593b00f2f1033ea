//! JSON Schema to [`Grammar`]: the subset OpenAI's strict mode uses, and a little more.
//!
//! Supported: `type` (one or an array, `"null"` included), `enum`, `const`, `anyOf`,
//! `$ref` to `#`, `#/$defs/...` or `#/definitions/...` (recursion allowed), `properties`,
//! `required`, `additionalProperties` (false, true, or a schema), `items` (one schema),
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`,
//! `exclusiveMinimum`/`exclusiveMaximum` (numbers), and the descriptive keywords
//! ([`DESCRIPTIVE`]), which are ignored. Any other keyword is an error naming it and where
//! it is, never silently dropped. A schema without `type` takes its type from its keywords
//! (`properties` → object, `items` → array, ...) and is any JSON value when it has none.
//! `enum`/`const` values are kept only if they fit the schema's `type`.
//!
//! Limits: [`MAX_SCHEMA_BYTES`] of schema JSON, [`MAX_NODES`] grammar nodes, [`MAX_NESTING`]
//! levels of schema nesting, [`MAX_PROPERTIES`] properties per object.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::grammar::{Bound, Grammar, MAX_PROPERTIES, Node, NodeId, NumSpec, ObjSpec};

/// Most bytes of schema JSON (serialized) one constraint may hold.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Most grammar nodes one constraint may compile to.
pub const MAX_NODES: usize = 20_000;
/// Deepest schema nesting.
pub const MAX_NESTING: usize = 32;
/// Keywords accepted and ignored (they do not restrict instances).
pub const DESCRIPTIVE: &[&str] = &[
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "strict",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// A schema the compiler refuses, with the reason (naming the keyword and its path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError(pub String);

type Res<T> = Result<T, SchemaError>;

/// Compiles JSON Schemas into nodes of one grammar, sharing `$ref` targets.
pub struct Compiler<'g> {
    g: &'g mut Grammar,
    /// `$ref` targets already compiled, by (root index, reference).
    refs: HashMap<(usize, String), NodeId>,
    /// Schema roots (`$ref` resolves against the root of the schema it appears in).
    roots: Vec<Value>,
    /// Whether an object that declares `properties` and says nothing of
    /// `additionalProperties` is closed (tool arguments) rather than open (JSON Schema).
    closed: bool,
}

impl<'g> Compiler<'g> {
    /// A compiler adding to `g`.
    pub fn new(g: &'g mut Grammar) -> Self {
        Self {
            g,
            refs: HashMap::new(),
            roots: Vec::new(),
            closed: false,
        }
    }

    /// A compiler for tool arguments: an object schema that declares `properties` without
    /// `additionalProperties` admits only those properties, as xgrammar's strict mode (vLLM's
    /// default) reads a function's parameters. A function takes what it declares; without
    /// this a small model fills a forced call with invented keys (the first BFCL item came
    /// back as `{"type":{"type":...` until `max_tokens`). Objects without `properties`
    /// (free-form dicts) stay open.
    pub fn for_tool_arguments(g: &'g mut Grammar) -> Self {
        Self {
            closed: true,
            ..Self::new(g)
        }
    }

    /// Compiles `schema` (whose `$ref`s resolve against itself); `at` names where it is in
    /// the request (for error messages).
    pub fn compile(&mut self, schema: &Value, at: &str) -> Res<NodeId> {
        let size = serde_json::to_string(schema).map_or(usize::MAX, |s| s.len());
        if size > MAX_SCHEMA_BYTES {
            return Err(SchemaError(format!(
                "{at}: schema of {size} bytes exceeds the limit of {MAX_SCHEMA_BYTES}"
            )));
        }
        self.roots.push(schema.clone());
        let root = self.roots.len() - 1;
        self.node(root, schema, at, 0)
    }

    fn push(&mut self, n: Node) -> Res<NodeId> {
        self.room()?;
        Ok(self.g.push(n))
    }

    fn room(&self) -> Res<()> {
        if self.g.nodes.len() >= MAX_NODES {
            return Err(SchemaError(format!(
                "schema compiles to more than {MAX_NODES} states; simplify it"
            )));
        }
        Ok(())
    }

    fn node(&mut self, root: usize, s: &Value, at: &str, depth: usize) -> Res<NodeId> {
        if depth > MAX_NESTING {
            return Err(SchemaError(format!(
                "{at}: schema nested deeper than {MAX_NESTING} levels"
            )));
        }
        let o = match s {
            Value::Bool(true) => return Ok(Grammar::ANY),
            Value::Bool(false) => {
                return Err(SchemaError(format!("{at}: schema `false` admits no value")));
            }
            Value::Object(o) => o,
            _ => {
                return Err(SchemaError(format!(
                    "{at}: a schema must be an object or a boolean"
                )));
            }
        };
        for k in o.keys() {
            if !KNOWN.contains(&k.as_str()) && !DESCRIPTIVE.contains(&k.as_str()) {
                return Err(SchemaError(format!(
                    "unsupported JSON Schema keyword \"{k}\" at {at}"
                )));
            }
        }
        if o.get("uniqueItems")
            .is_some_and(|v| v != &Value::Bool(false))
        {
            return Err(SchemaError(format!(
                "unsupported JSON Schema keyword \"uniqueItems\" at {at}"
            )));
        }
        if let Some(r) = o.get("$ref") {
            only_with(o, "$ref", &["$defs", "definitions"], at)?;
            let r = r
                .as_str()
                .ok_or_else(|| SchemaError(format!("{at}.$ref must be a string")))?;
            return self.reference(root, r, at, depth);
        }
        if let Some(any) = o.get("anyOf") {
            only_with(o, "anyOf", &["$defs", "definitions"], at)?;
            let items = any
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| SchemaError(format!("{at}.anyOf must be a non-empty array")))?;
            let mut alts = Vec::with_capacity(items.len());
            for (i, sub) in items.iter().enumerate() {
                alts.push(self.node(root, sub, &format!("{at}.anyOf[{i}]"), depth + 1)?);
            }
            return self.push(Node::Alt(alts.into()));
        }
        let types: Vec<&str> = match o.get("type") {
            None => inferred(o, at)?.into_iter().collect(),
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => {
                let ts: Option<Vec<&str>> = ts.iter().map(Value::as_str).collect();
                ts.filter(|t| !t.is_empty()).ok_or_else(|| {
                    SchemaError(format!(
                        "{at}.type must be a type name or a non-empty array of them"
                    ))
                })?
            }
            Some(_) => {
                return Err(SchemaError(format!(
                    "{at}.type must be a type name or an array of them"
                )));
            }
        };
        for t in &types {
            if ![
                "null", "boolean", "integer", "number", "string", "array", "object",
            ]
            .contains(t)
            {
                return Err(SchemaError(format!("{at}.type: unknown type \"{t}\"")));
            }
        }
        if let Some(values) = enum_values(o, at)? {
            let fits = |v: &Value| types.is_empty() || types.iter().any(|t| type_fits(t, v));
            let nothing = self.push(Node::Seq(Box::new([])))?;
            let mut keys = Vec::new();
            for v in values.iter().filter(|v| fits(v)) {
                let text =
                    serde_json::to_string(v).map_err(|e| SchemaError(format!("{at}.enum: {e}")))?;
                keys.push((text.into_bytes().into(), nothing));
            }
            if keys.is_empty() {
                return Err(SchemaError(format!(
                    "{at}: no enum/const value fits the schema's type"
                )));
            }
            // one reading for all values, however many (an Alt keeps MAX_STACKS readings)
            self.room()?;
            return Ok(self.g.switch(keys));
        }
        if types.is_empty() {
            return Ok(Grammar::ANY);
        }
        let mut alts = Vec::with_capacity(types.len());
        for t in types {
            alts.push(self.typed(root, o, t, at, depth)?);
        }
        if alts.len() == 1 {
            Ok(alts[0])
        } else {
            self.push(Node::Alt(alts.into()))
        }
    }

    fn typed(
        &mut self,
        root: usize,
        o: &Map<String, Value>,
        t: &str,
        at: &str,
        depth: usize,
    ) -> Res<NodeId> {
        match t {
            "null" => self.push(Node::Lit((*b"null").into())),
            "boolean" => {
                let a = self.push(Node::Lit((*b"true").into()))?;
                let b = self.push(Node::Lit((*b"false").into()))?;
                self.push(Node::Alt([a, b].into()))
            }
            "string" => {
                let min = count(o, "minLength", at)?.unwrap_or(0);
                let max = count(o, "maxLength", at)?.unwrap_or(u32::MAX);
                if min > max {
                    return Err(SchemaError(format!("{at}: minLength exceeds maxLength")));
                }
                self.push(Node::Str { min, max })
            }
            "integer" | "number" => self.push(Node::Num(num_spec(o, t == "integer", at)?)),
            "array" => {
                let items = match o.get("items") {
                    None => Grammar::ANY,
                    Some(Value::Array(_)) => {
                        return Err(SchemaError(format!(
                            "unsupported JSON Schema keyword \"items\" as an array at {at}"
                        )));
                    }
                    Some(s) => self.node(root, s, &format!("{at}.items"), depth + 1)?,
                };
                let min = count(o, "minItems", at)?.unwrap_or(0);
                let max = count(o, "maxItems", at)?.unwrap_or(u32::MAX);
                if min > max {
                    return Err(SchemaError(format!("{at}: minItems exceeds maxItems")));
                }
                self.push(Node::Arr { items, min, max })
            }
            _ => self.object(root, o, at, depth),
        }
    }

    fn object(
        &mut self,
        root: usize,
        o: &Map<String, Value>,
        at: &str,
        depth: usize,
    ) -> Res<NodeId> {
        let empty = Map::new();
        let props = match o.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(SchemaError(format!("{at}.properties must be an object"))),
        };
        if props.len() > MAX_PROPERTIES {
            return Err(SchemaError(format!(
                "{at}: more than {MAX_PROPERTIES} properties"
            )));
        }
        let mut keys = Vec::with_capacity(props.len());
        let mut values = Vec::with_capacity(props.len());
        for (name, sub) in props {
            let quoted =
                serde_json::to_string(name).map_err(|e| SchemaError(format!("{at}: {e}")))?;
            keys.push(quoted.as_bytes()[1..quoted.len() - 1].into());
            values.push(self.node(root, sub, &format!("{at}.properties.{name}"), depth + 1)?);
        }
        let mut required = 0u64;
        if let Some(r) = o.get("required") {
            let names = r
                .as_array()
                .ok_or_else(|| SchemaError(format!("{at}.required must be an array")))?;
            for n in names {
                let n = n
                    .as_str()
                    .ok_or_else(|| SchemaError(format!("{at}.required must hold strings")))?;
                let i = props.keys().position(|k| k == n).ok_or_else(|| {
                    SchemaError(format!(
                        "{at}.required names \"{n}\", which is not in properties"
                    ))
                })?;
                required |= 1u64 << i;
            }
        }
        let additional = match o.get("additionalProperties") {
            None if self.closed && o.contains_key("properties") => None,
            None | Some(Value::Bool(true)) => Some(Grammar::ANY),
            Some(Value::Bool(false)) => None,
            Some(s) => {
                Some(self.node(root, s, &format!("{at}.additionalProperties"), depth + 1)?)
            }
        };
        self.push(Node::Obj(Box::new(ObjSpec {
            keys,
            values,
            required,
            additional,
        })))
    }

    fn reference(&mut self, root: usize, r: &str, at: &str, depth: usize) -> Res<NodeId> {
        if let Some(&id) = self.refs.get(&(root, r.to_owned())) {
            return Ok(id);
        }
        let pointer = r.strip_prefix('#').ok_or_else(|| {
            SchemaError(format!(
                "{at}.$ref {r:?}: only local references (#...) are supported"
            ))
        })?;
        if !(pointer.is_empty()
            || pointer.starts_with("/$defs/")
            || pointer.starts_with("/definitions/"))
        {
            return Err(SchemaError(format!(
                "{at}.$ref {r:?}: only #, #/$defs/... and #/definitions/... are supported"
            )));
        }
        let target = self.roots[root]
            .pointer(pointer)
            .cloned()
            .ok_or_else(|| SchemaError(format!("{at}.$ref {r:?} points at nothing")))?;
        // reserve the id first so recursive references find it
        let id = self.push(Node::Seq(Box::new([])))?;
        self.refs.insert((root, r.to_owned()), id);
        let inner = self.node(root, &target, &format!("{at}.$ref({r})"), depth + 1)?;
        self.g.nodes[id as usize] = Node::Seq([inner].into());
        Ok(id)
    }
}

/// Keywords that restrict instances and are supported.
const KNOWN: &[&str] = &[
    "type",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
];

/// Refuses keywords (other than descriptive ones and `also`) next to `kw`.
fn only_with(o: &Map<String, Value>, kw: &str, also: &[&str], at: &str) -> Res<()> {
    match o.keys().find(|k| {
        k.as_str() != kw && !also.contains(&k.as_str()) && !DESCRIPTIVE.contains(&k.as_str())
    }) {
        Some(k) => Err(SchemaError(format!(
            "unsupported JSON Schema keyword \"{k}\" next to \"{kw}\" at {at}"
        ))),
        None => Ok(()),
    }
}

/// The type a schema without `type` implies by its keywords (None: any value).
fn inferred(o: &Map<String, Value>, at: &str) -> Res<Option<&'static str>> {
    let groups: [(&str, &[&str]); 4] = [
        (
            "object",
            &["properties", "required", "additionalProperties"],
        ),
        ("array", &["items", "minItems", "maxItems"]),
        ("string", &["minLength", "maxLength"]),
        (
            "number",
            &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
        ),
    ];
    let found: Vec<&str> = groups
        .iter()
        .filter(|(_, ks)| ks.iter().any(|k| o.contains_key(*k)))
        .map(|(t, _)| *t)
        .collect();
    match found.as_slice() {
        [] => Ok(None),
        [t] => Ok(Some(t)),
        _ => Err(SchemaError(format!(
            "{at}: keywords of several types without \"type\"; add \"type\""
        ))),
    }
}

fn enum_values(o: &Map<String, Value>, at: &str) -> Res<Option<Vec<Value>>> {
    match (o.get("enum"), o.get("const")) {
        (Some(_), Some(_)) => Err(SchemaError(format!("{at}: both enum and const"))),
        (Some(Value::Array(vs)), None) if !vs.is_empty() => Ok(Some(vs.clone())),
        (Some(_), None) => Err(SchemaError(format!("{at}.enum must be a non-empty array"))),
        (None, Some(v)) => Ok(Some(vec![v.clone()])),
        (None, None) => Ok(None),
    }
}

fn type_fits(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        _ => v.is_object(),
    }
}

fn count(o: &Map<String, Value>, k: &str, at: &str) -> Res<Option<u32>> {
    match o.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(u64::from(u32::MAX - 1)) as u32))
            .ok_or_else(|| SchemaError(format!("{at}.{k} must be a non-negative integer"))),
    }
}

/// Largest bound magnitude accepted (integers are exact in f64 below it).
const MAX_BOUND: f64 = 9_007_199_254_740_992.0;

fn num_spec(o: &Map<String, Value>, integer: bool, at: &str) -> Res<NumSpec> {
    let get = |k: &str| -> Res<Option<f64>> {
        match o.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(f) if f.abs() <= MAX_BOUND => Ok(Some(f)),
                Some(_) => Err(SchemaError(format!(
                    "{at}.{k}: magnitude above 2^53 is not supported"
                ))),
                None => Err(SchemaError(format!("{at}.{k} must be a number"))),
            },
        }
    };
    let pick = |incl: Option<f64>, excl: Option<f64>, lower: bool| -> Option<Bound> {
        match (incl, excl) {
            (Some(a), Some(b)) => {
                let a_tighter = if lower { a > b } else { a < b };
                Some(if a_tighter {
                    Bound {
                        v: a,
                        strict: false,
                    }
                } else {
                    Bound { v: b, strict: true }
                })
            }
            (Some(a), None) => Some(Bound {
                v: a,
                strict: false,
            }),
            (None, Some(b)) => Some(Bound { v: b, strict: true }),
            (None, None) => None,
        }
    };
    let mut lo = pick(get("minimum")?, get("exclusiveMinimum")?, true);
    let mut hi = pick(get("maximum")?, get("exclusiveMaximum")?, false);
    if integer {
        // integer bounds on integers: ceil/floor, strict made inclusive
        lo = lo.map(|b| Bound {
            v: if b.strict {
                b.v.floor() + 1.0
            } else {
                b.v.ceil()
            },
            strict: false,
        });
        hi = hi.map(|b| Bound {
            v: if b.strict {
                b.v.ceil() - 1.0
            } else {
                b.v.floor()
            },
            strict: false,
        });
    }
    if let (Some(l), Some(h)) = (lo, hi)
        && (l.v > h.v || (l.v == h.v && (l.strict || h.strict)))
    {
        return Err(SchemaError(format!(
            "{at}: no number lies within the bounds"
        )));
    }
    Ok(NumSpec { integer, lo, hi })
}
