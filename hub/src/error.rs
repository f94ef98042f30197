//! What can go wrong talking to the Hub, typed so that callers can say what to do: each error
//! has a message naming the repository, the file or the endpoint, and [`HubError::fix`].

use std::fmt;
use std::path::PathBuf;

/// Which part of a Hub address was not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The repository (or it is private and the request had no access).
    Repo,
    /// The revision (branch, tag or commit).
    Revision,
    /// A file at an existing revision.
    File,
}

/// An error from the Hub or the cache.
#[derive(Debug, Clone, PartialEq)]
pub enum HubError {
    /// The text is not a Hub id (`org/name` or `org/name@revision`).
    InvalidId {
        /// What was given.
        spec: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An environment variable holds a value that cannot be used.
    Setting {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        problem: String,
    },
    /// `HF_HUB_OFFLINE` is set (or the Hub could not be reached) and the cache lacks something.
    Offline {
        /// `org/name@revision`.
        repo: String,
        /// What the cache lacks.
        missing: String,
        /// True when `HF_HUB_OFFLINE` asked for it; false when the endpoint was unreachable.
        asked: bool,
    },
    /// No answer from the endpoint: connection refused, name not resolved, timed out.
    Unreachable {
        /// The endpoint (`HF_ENDPOINT`).
        endpoint: String,
        /// The URL asked for.
        url: String,
        /// What the transport said, after every retry.
        detail: String,
    },
    /// 401/403: the repository is gated or private and the request's token has no access.
    Access {
        /// `org/name`.
        repo: String,
        /// The HTTP status.
        status: u16,
        /// The Hub said the repository is gated (`X-Error-Code: GatedRepo`).
        gated: bool,
        /// Where the token sent came from, `None` when none was sent.
        token: Option<String>,
        /// The Hub's own message (`X-Error-Message`), when it gave one.
        message: Option<String>,
    },
    /// 404 (or the Hub's `RepoNotFound`/`RevisionNotFound`/`EntryNotFound`).
    NotFound {
        /// `org/name`.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The file, when a file was asked for.
        file: Option<String>,
        /// Which part is missing.
        missing: Missing,
    },
    /// Another HTTP status, after retries where it was transient.
    Status {
        /// The URL asked for.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The Hub's message, when it gave one.
        message: Option<String>,
    },
    /// An answer that does not follow the Hub's protocol (no commit, a bad range, bad JSON, a
    /// file too large).
    Protocol {
        /// The URL asked for, or the cached file read.
        url: String,
        /// What is wrong.
        problem: String,
    },
    /// Reading or writing the cache failed.
    Cache {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        detail: String,
    },
}

impl HubError {
    /// What the user can do about it.
    pub fn fix(&self) -> Option<String> {
        Some(match self {
            HubError::InvalidId { .. } => {
                "give a Hub id as `org/name` or `org/name@revision` (a branch, tag or commit)".into()
            }
            HubError::Setting { var, .. } => format!("correct or unset {var}"),
            HubError::Offline { asked: true, .. } => {
                "unset HF_HUB_OFFLINE to fetch it (vramplan reads config files and safetensors headers, a few \
                 KiB a shard), or download the model first with `hf download`"
                    .into()
            }
            HubError::Offline { asked: false, .. } => {
                "check the connection to the Hub, or set HF_ENDPOINT to a mirror".into()
            }
            HubError::Unreachable { .. } => "check the connection (and HTTPS_PROXY), set HF_ENDPOINT to a \
                                              reachable mirror, or set HF_HUB_OFFLINE=1 to read a model already \
                                              in the cache"
                .into(),
            HubError::Access { repo, gated, token, .. } => {
                let token = match token {
                    None => "then set HF_TOKEN to a token of that account (or run `hf auth login`)".to_string(),
                    Some(from) => format!(
                        "the token sent (from {from}) has no access: request it there with that account, or \
                         set HF_TOKEN to a token of an account that has it (or run `hf auth login`)"
                    ),
                };
                if *gated {
                    format!("request access on the model page (https://huggingface.co/{repo}), {token}")
                } else {
                    format!("if the repository is private or gated, get access on its page, {token}")
                }
            }
            HubError::NotFound { missing: Missing::Repo, .. } => {
                "check the spelling (`org/name`, as on the model page); a private repository needs HF_TOKEN".into()
            }
            HubError::NotFound { missing: Missing::Revision, .. } => {
                "give a branch, tag or commit the repository has (`org/name@main`)".into()
            }
            HubError::NotFound { missing: Missing::File, .. } => {
                "the repository lacks a file the model needs; give a model folder or config.json instead".into()
            }
            HubError::Status { .. } => "try again later, or set HF_ENDPOINT to a mirror".into(),
            HubError::Protocol { .. } => "check HF_ENDPOINT: it should be the Hub or a mirror of it".into(),
            HubError::Cache { .. } => {
                "make the cache folder writable, or point HF_HUB_CACHE (or HF_HOME) elsewhere".into()
            }
        })
    }
}

impl fmt::Display for HubError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubError::InvalidId { spec, problem } => write!(f, "`{spec}` is not a Hub id: {problem}"),
            HubError::Setting { var, value, problem } => write!(f, "{var}=`{value}`: {problem}"),
            HubError::Offline { repo, missing, asked: true } => {
                write!(f, "offline (HF_HUB_OFFLINE is set) and the cache lacks {missing} of `{repo}`")
            }
            HubError::Offline { repo, missing, asked: false } => write!(
                f,
                "the Hub could not be reached, and the cache holds part of `{repo}` but lacks {missing}"
            ),
            HubError::Unreachable { endpoint, url, detail } => {
                write!(f, "cannot reach the Hub at {endpoint} ({detail}; asking {url})")
            }
            HubError::Access { repo, status, gated, token, message } => {
                let what = if *gated { "is gated" } else { "is private or gated" };
                let sent = if token.is_some() { "the token sent has no access" } else { "no token was sent" };
                write!(f, "`{repo}` {what} and {sent} (HTTP {status})")?;
                if let Some(message) = message {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            HubError::NotFound { repo, revision, file, missing } => match (missing, file) {
                (Missing::Repo, _) => write!(f, "no repository `{repo}` on the Hub"),
                (Missing::Revision, _) => write!(f, "`{repo}` has no revision `{revision}`"),
                (Missing::File, Some(file)) => write!(f, "`{repo}` has no file `{file}` at `{revision}`"),
                (Missing::File, None) => write!(f, "`{repo}@{revision}`: not found"),
            },
            HubError::Status { url, status, message } => {
                write!(f, "the Hub answered HTTP {status} for {url}")?;
                if let Some(message) = message {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            HubError::Protocol { url, problem } => write!(f, "{url}: {problem}"),
            HubError::Cache { path, detail } => write!(f, "cache {}: {detail}", path.display()),
        }
    }
}

impl std::error::Error for HubError {}
