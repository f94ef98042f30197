//! Where the Hub is and who asks: the environment read exactly as `huggingface_hub` reads it
//! (`huggingface_hub/constants.py` and `utils/_auth.py`).
//!
//! - `HF_ENDPOINT` (default `https://huggingface.co`, trailing `/` removed);
//! - `HF_HOME` (default `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`);
//! - `HF_HUB_CACHE` (legacy `HUGGINGFACE_HUB_CACHE`, default `$HF_HOME/hub`);
//! - `HF_HUB_OFFLINE` (legacy `TRANSFORMERS_OFFLINE`): true for `1`, `ON`, `YES`, `TRUE` in any
//!   case, anything else false;
//! - the token: `HF_TOKEN` (legacy `HUGGING_FACE_HUB_TOKEN`), else the file at `HF_TOKEN_PATH`
//!   (default `$HF_HOME/token`); newlines removed, spaces trimmed, empty means none;
//! - `HF_HUB_DOWNLOAD_TIMEOUT`: seconds a request may wait to connect or for an answer
//!   (default 10, `constants.DEFAULT_DOWNLOAD_TIMEOUT`).
//!
//! Paths go through `~` and `$VAR` expansion, as `os.path.expanduser(os.path.expandvars(...))`.

use crate::HubError;
use std::path::PathBuf;
use std::time::Duration;

/// `constants._HF_DEFAULT_ENDPOINT`.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// `constants.DEFAULT_DOWNLOAD_TIMEOUT`, seconds.
const DEFAULT_TIMEOUT_S: u64 = 10;

/// Where the token came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The `HF_TOKEN` (or legacy `HUGGING_FACE_HUB_TOKEN`) variable.
    Env(&'static str),
    /// The token file (`HF_TOKEN_PATH`, else `$HF_HOME/token`), as `hf auth login` writes it.
    File(PathBuf),
}

/// Everything the Hub client needs from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The Hub's base URL, without a trailing `/`.
    pub endpoint: String,
    /// The bearer token sent to the endpoint, with where it came from.
    pub token: Option<(String, TokenSource)>,
    /// `HF_HUB_OFFLINE`: no request is made; only the cache answers.
    pub offline: bool,
    /// The shared cache folder (`HF_HUB_CACHE`), holding `models--{org}--{name}` folders.
    pub cache: PathBuf,
    /// How long a request may wait to connect, and then for the answer's first byte.
    pub timeout: Duration,
}

impl Settings {
    /// The settings this process's environment gives.
    pub fn from_env() -> Result<Settings, HubError> {
        Settings::from_vars(|name| std::env::var(name).ok())
    }

    /// The settings an environment gives, its variables read through `var` (so tests need not
    /// change the process's environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings, HubError> {
        let home_dir = var("HOME").or_else(|| var("USERPROFILE")).unwrap_or_else(|| ".".into());
        let expand = |value: &str| PathBuf::from(expand_user(&expand_vars(value, &var), &home_dir));
        let hf_home = match var("HF_HOME") {
            Some(value) => expand(&value),
            None => {
                let cache_home = var("XDG_CACHE_HOME").unwrap_or_else(|| format!("{home_dir}/.cache"));
                expand(&format!("{cache_home}/huggingface"))
            }
        };
        let cache = match var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
            Some(value) => expand(&value),
            None => hf_home.join("hub"),
        };
        let endpoint =
            var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.into()).trim_end_matches('/').to_string();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(HubError::Setting {
                var: "HF_ENDPOINT",
                value: endpoint,
                problem: "expected a URL starting with http:// or https://".into(),
            });
        }
        // `os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")`: an empty
        // HF_HUB_OFFLINE falls through to the legacy variable.
        let offline = is_true(
            var("HF_HUB_OFFLINE")
                .filter(|v| !v.is_empty())
                .or_else(|| var("TRANSFORMERS_OFFLINE"))
                .as_deref(),
        );
        let token = match clean_token(var("HF_TOKEN").filter(|v| !v.is_empty()).as_deref()) {
            Some(token) => Some((token, TokenSource::Env("HF_TOKEN"))),
            None => match clean_token(var("HUGGING_FACE_HUB_TOKEN").as_deref()) {
                Some(token) => Some((token, TokenSource::Env("HUGGING_FACE_HUB_TOKEN"))),
                None => {
                    let path = match var("HF_TOKEN_PATH") {
                        Some(value) => expand(&value),
                        None => hf_home.join("token"),
                    };
                    let text = std::fs::read_to_string(&path).ok();
                    clean_token(text.as_deref()).map(|token| (token, TokenSource::File(path)))
                }
            },
        };
        let timeout = match var("HF_HUB_DOWNLOAD_TIMEOUT") {
            None => Duration::from_secs(DEFAULT_TIMEOUT_S),
            Some(value) => match value.trim().parse::<u64>() {
                Ok(seconds) if seconds > 0 => Duration::from_secs(seconds),
                _ => {
                    return Err(HubError::Setting {
                        var: "HF_HUB_DOWNLOAD_TIMEOUT",
                        value,
                        problem: "expected a whole number of seconds above 0".into(),
                    });
                }
            },
        };
        Ok(Settings { endpoint, token, offline, cache, timeout })
    }
}

/// `constants._is_true`: `1`, `ON`, `YES`, `TRUE` in any case.
pub fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.to_ascii_uppercase().as_str()))
}

/// `_auth._clean_token`: newlines removed, spaces trimmed, empty is none.
fn clean_token(token: Option<&str>) -> Option<String> {
    let cleaned = token?.replace(['\r', '\n'], "");
    let cleaned = cleaned.trim();
    (!cleaned.is_empty()).then(|| cleaned.to_string())
}

/// `os.path.expanduser`: a leading `~` (alone or before a separator) is the home folder.
fn expand_user(path: &str, home: &str) -> String {
    match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') || rest.starts_with('\\') => {
            format!("{home}{rest}")
        }
        _ => path.to_string(),
    }
}

/// `os.path.expandvars`: `$NAME` and `${NAME}` replaced by the variable's value; unknown ones
/// are left as written.
fn expand_vars(text: &str, var: &impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, consumed) = match after.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            },
            None => {
                let end =
                    after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        match (name.is_empty(), var(name)) {
            (false, Some(value)) => out.push_str(&value),
            _ => out.push_str(&rest[at..at + 1 + consumed]),
        }
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn settings(vars: &[(&str, &str)]) -> Settings {
        let map: BTreeMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Settings::from_vars(|name| map.get(name).cloned()).unwrap()
    }

    #[test]
    fn defaults_follow_huggingface_hub() {
        let s = settings(&[("HOME", "/home/u")]);
        assert_eq!(s.endpoint, "https://huggingface.co");
        assert_eq!(s.cache, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert!(!s.offline);
        assert_eq!(s.timeout, Duration::from_secs(10));
        let s = settings(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(s.cache, PathBuf::from("/xdg/huggingface/hub"));
        let s = settings(&[("HOME", "/home/u"), ("HF_HOME", "~/hf"), ("HF_ENDPOINT", "http://127.0.0.1:9/")]);
        assert_eq!(s.cache, PathBuf::from("/home/u/hf/hub"));
        assert_eq!(s.endpoint, "http://127.0.0.1:9");
        let s = settings(&[("HF_HOME", "/a"), ("HF_HUB_CACHE", "$HF_HOME/elsewhere")]);
        assert_eq!(s.cache, PathBuf::from("/a/elsewhere"));
        let s = settings(&[("HUGGINGFACE_HUB_CACHE", "/legacy")]);
        assert_eq!(s.cache, PathBuf::from("/legacy"));
    }

    #[test]
    fn offline_takes_huggingface_hubs_true_values() {
        for (value, expected) in [
            ("1", true),
            ("on", true),
            ("Yes", true),
            ("TRUE", true),
            ("0", false),
            ("no", false),
            ("", false),
        ] {
            assert_eq!(settings(&[("HF_HUB_OFFLINE", value)]).offline, expected, "{value}");
        }
        assert!(settings(&[("TRANSFORMERS_OFFLINE", "1")]).offline);
        assert!(settings(&[("HF_HUB_OFFLINE", ""), ("TRANSFORMERS_OFFLINE", "1")]).offline);
        assert!(!settings(&[("HF_HUB_OFFLINE", "0"), ("TRANSFORMERS_OFFLINE", "1")]).offline);
    }

    #[test]
    fn token_from_env_then_file() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display().to_string();
        std::fs::write(dir.path().join("token"), "hf_file\n").unwrap();
        let s = settings(&[("HF_HOME", &home)]);
        assert_eq!(s.token, Some(("hf_file".into(), TokenSource::File(dir.path().join("token")))));
        let s = settings(&[("HF_HOME", &home), ("HF_TOKEN", " hf_env \r\n")]);
        assert_eq!(s.token, Some(("hf_env".into(), TokenSource::Env("HF_TOKEN"))));
        let s = settings(&[("HF_HOME", &home), ("HUGGING_FACE_HUB_TOKEN", "hf_old")]);
        assert_eq!(s.token.unwrap().0, "hf_old");
        std::fs::write(dir.path().join("other"), "hf_other").unwrap();
        let other = dir.path().join("other").display().to_string();
        let s = settings(&[("HF_HOME", &home), ("HF_TOKEN_PATH", &other)]);
        assert_eq!(s.token.unwrap().0, "hf_other");
        let s = settings(&[("HF_HOME", "/nowhere"), ("HF_TOKEN", "  ")]);
        assert_eq!(s.token, None);
    }

    #[test]
    fn bad_values_are_refused() {
        let e = Settings::from_vars(|n| (n == "HF_HUB_DOWNLOAD_TIMEOUT").then(|| "soon".into())).unwrap_err();
        assert!(e.to_string().contains("HF_HUB_DOWNLOAD_TIMEOUT"), "{e}");
        let e = Settings::from_vars(|n| (n == "HF_ENDPOINT").then(|| "huggingface.co".into())).unwrap_err();
        assert!(e.to_string().contains("http"), "{e}");
    }
}
