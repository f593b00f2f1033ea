//! Types shared by every route: token usage, the OpenAI error body, stop sequences and the
//! model list.

use serde::{Deserialize, Serialize};

use crate::Extra;

/// Token counts as OpenAI reports them; providers add detail objects, kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt (after the chat template).
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum, as the provider reported it.
    #[serde(default)]
    pub total_tokens: u64,
    /// `prompt_tokens_details`, `completion_tokens_details` and anything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop sequence.
    One(String),
    /// Up to a few stop sequences.
    Many(Vec<String>),
}

impl Stop {
    /// The stop sequences as a list, whichever form was sent.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        }
    }
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A sentence for the person reading it, in the caller's terms.
    pub message: String,
    /// OpenAI's class of error: `invalid_request_error`, `authentication_error`,
    /// `rate_limit_error`, `server_error`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when there is one.
    #[serde(default)]
    pub param: Option<String>,
    /// A stable machine-readable code (`model_not_found`, `invalid_json`, ...).
    #[serde(default)]
    pub code: Option<String>,
}

impl ErrorBody {
    /// An error with a message, an OpenAI error type and an optional code.
    pub fn new(message: impl Into<String>, kind: impl Into<String>, code: Option<&str>) -> Self {
        ErrorBody {
            error: ErrorDetail {
                message: message.into(),
                kind: kind.into(),
                param: None,
                code: code.map(str::to_owned),
            },
        }
    }

    /// The same error naming the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    /// The body as JSON text; infallible for this type.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#
                .to_owned()
        })
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    /// The models.
    pub data: Vec<ModelObject>,
}

/// One entry of [`ModelList`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelObject {
    /// The name clients put in `model`.
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Who serves it.
    #[serde(default)]
    pub owned_by: String,
    /// Provider-specific fields (`max_model_len`, ...).
    #[serde(flatten)]
    pub extra: Extra,
}

impl ModelList {
    /// A list of the given model ids, owned by `owner`.
    pub fn of(ids: impl IntoIterator<Item = String>, owner: &str, created: u64) -> Self {
        ModelList {
            object: "list".to_owned(),
            data: ids
                .into_iter()
                .map(|id| ModelObject::new(id, owner, created))
                .collect(),
        }
    }
}

impl ModelObject {
    /// Model `id`, owned by `owner`, with no provider-specific fields.
    pub fn new(id: String, owner: &str, created: u64) -> Self {
        ModelObject {
            id,
            object: "model".to_owned(),
            created,
            owned_by: owner.to_owned(),
            extra: Extra::new(),
        }
    }
}
