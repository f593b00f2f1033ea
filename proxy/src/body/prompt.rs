//! The prompt's check and its characters (`messages` on the chat route, `prompt` on the
//! completions route), walked over the raw JSON borrowed from the body in one pass: only the
//! text that is counted is decoded, no `serde_json::Value` is built.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::{Key, Object, Route};
use crate::error::ApiError;

/// Checks `messages` / `prompt` and returns the characters of prompt text; None when a part
/// of it does not decode (nesting past serde_json's limit, a string that is not text): the
/// caller's 400. Walks the raw values borrowed from the body in one pass: only what is counted
/// is decoded, nothing is built.
pub(super) fn check_prompt(route: Route, v: &RawValue) -> Option<Result<usize, ApiError>> {
    Some(match route {
        Route::Chat => {
            if !v.get().starts_with('[') {
                return Some(Err(ApiError::bad_request(
                    "invalid_type",
                    "`messages` must be an array",
                    Some("messages"),
                )));
            }
            let msgs = serde_json::from_str::<Vec<&RawValue>>(v.get()).ok()?;
            if msgs.is_empty() {
                return Some(Err(ApiError::bad_request(
                    "invalid_value",
                    "`messages` must not be empty",
                    Some("messages"),
                )));
            }
            let mut chars = 0;
            for (i, m) in msgs.iter().enumerate() {
                if !m.get().starts_with('{') {
                    let p = format!("messages[{i}]");
                    return Some(Err(ApiError::bad_request(
                        "invalid_type",
                        format!("`{p}` must be an object"),
                        Some(&p),
                    )));
                }
                let fields = fields_of(m)?;
                if !fields.get("role").is_some_and(|r| r.get().starts_with('"')) {
                    let p = format!("messages[{i}].role");
                    return Some(Err(ApiError::bad_request(
                        "invalid_type",
                        format!("`{p}` must be a string"),
                        Some(&p),
                    )));
                }
                chars += text_chars(fields.get("content"))?;
            }
            Ok(chars)
        }
        Route::Completions => match v.get().as_bytes().first() {
            Some(b'"') => Ok(text_chars(Some(v))?),
            Some(b'[') => {
                let items = serde_json::from_str::<Vec<&RawValue>>(v.get()).ok()?;
                if items.is_empty() {
                    Err(prompt_shape())
                } else {
                    let mut chars = 0;
                    for item in items {
                        chars += text_chars(Some(item))?;
                    }
                    Ok(chars)
                }
            }
            _ => Err(prompt_shape()),
        },
    })
}

fn prompt_shape() -> ApiError {
    ApiError::bad_request(
        "invalid_type",
        "`prompt` must be a string or a non-empty array",
        Some("prompt"),
    )
}

/// Characters of text in a message content (string, or parts with `text`) or prompt item;
/// token-id prompts count one "character" per token id times four (so /4 gives the ids). None
/// when it does not decode.
fn text_chars(v: Option<&RawValue>) -> Option<usize> {
    match v {
        None => Some(0),
        Some(v) => {
            let mut d = serde_json::Deserializer::from_str(v.get());
            serde::de::DeserializeSeed::deserialize(Count::Content, &mut d).ok()
        }
    }
}

/// Counts [`text_chars`] while deserializing, in one pass (serde_json's nesting limit holds):
/// a content is text, or parts; a part is an object's `text` (a content), a token id (4), or
/// a content itself.
#[derive(Clone, Copy)]
enum Count {
    Content,
    Part,
}

impl<'de> serde::de::DeserializeSeed<'de> for Count {
    type Value = usize;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Count {
    type Value = usize;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("prompt text")
    }
    fn visit_str<E>(self, v: &str) -> Result<usize, E> {
        Ok(v.chars().count())
    }
    fn visit_bool<E>(self, _: bool) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<usize, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<usize, E> {
        Ok(self.number())
    }
    fn visit_u64<E>(self, _: u64) -> Result<usize, E> {
        Ok(self.number())
    }
    fn visit_f64<E>(self, _: f64) -> Result<usize, E> {
        Ok(self.number())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut chars = 0;
        while let Some(c) = seq.next_element_seed(Count::Part)? {
            chars += c;
        }
        Ok(chars)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        // a part's `text` (the last one, if repeated); a content that is an object counts 0
        let mut text = 0;
        while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
            if matches!(self, Count::Part) && k == "text" {
                text = map.next_value_seed(Count::Content)?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(text)
    }
}

impl Count {
    fn number(self) -> usize {
        match self {
            Count::Content => 0,
            Count::Part => 4,
        }
    }
}

/// An object's fields as raw values, the last of a repeated key winning; for the few lookups
/// of a message or a content part.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// `raw`'s fields (an object's, as the caller checked).
fn fields_of(raw: &RawValue) -> Option<Fields<'_>> {
    serde_json::from_str::<Object<Vec<_>>>(raw.get())
        .ok()
        .map(|o| Fields(o.0))
}

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}
