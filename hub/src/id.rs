//! A Hub id as the user types it (`org/name`, `org/name@revision`), and the percent-encoding
//! `hf_hub_url` gives its parts in URLs.

use crate::HubError;

/// A Hub id as typed: `org/name` or `org/name@revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `org/name`.
    pub repo: String,
    /// The revision asked for, `main` when none was.
    pub revision: String,
}

impl HubId {
    /// Reads `spec` as a Hub id: `None` when it does not have that shape
    /// (`^[A-Za-z0-9][\w.-]*/[\w.-]+(@\S+)?$`), an error when it has it but the Hub would refuse
    /// it (`--` or `..` in the id, as `huggingface_hub.utils.validate_repo_id` refuses; a revision
    /// that would leave the cache folder).
    pub fn parse(spec: &str) -> Option<Result<HubId, HubError>> {
        let (repo, revision) = match spec.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (spec, None),
        };
        let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        let (org, name) = repo.split_once('/')?;
        let shaped = org.starts_with(|c: char| c.is_ascii_alphanumeric())
            && org.chars().all(word)
            && !name.is_empty()
            && name.chars().all(word)
            && revision.is_none_or(|r| !r.is_empty() && !r.chars().any(char::is_whitespace));
        if !shaped {
            return None;
        }
        let invalid =
            |problem: &str| Some(Err(HubError::InvalidId { spec: spec.into(), problem: problem.into() }));
        if repo.contains("--") || repo.contains("..") || name.len() > 96 {
            return invalid(
                "`--` and `..` are not allowed in a repository id, and a name has at most 96 characters",
            );
        }
        let revision = revision.unwrap_or("main");
        if revision.split('/').any(|part| part.is_empty() || part == "." || part == "..")
            || revision.contains('\\')
        {
            return invalid("a revision is a branch, tag or commit, without empty, `.` or `..` parts");
        }
        Some(Ok(HubId { repo: repo.into(), revision: revision.into() }))
    }
}

/// `urllib.parse.quote`: everything but letters, digits, `_.-~` percent-encoded, and `/` kept
/// where `keep_slash` (a file path; a revision is encoded whole, `safe=""`).
pub(crate) fn quote(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"_.-~".contains(&byte) || (keep_slash && byte == b'/') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_have_the_documented_shape() {
        let id = HubId::parse("meta-llama/Llama-3.1-8B").unwrap().unwrap();
        assert_eq!((id.repo.as_str(), id.revision.as_str()), ("meta-llama/Llama-3.1-8B", "main"));
        let id = HubId::parse("Qwen/Qwen2.5-0.5B@refs/pr/1").unwrap().unwrap();
        assert_eq!(id.revision, "refs/pr/1");
        for not_an_id in ["llama-2-7b", "./a/b", "/abs/path", "a/b/c", "a/b c", "-a/b", "a/", "a/b@"] {
            assert!(HubId::parse(not_an_id).is_none(), "{not_an_id}");
        }
        for refused in ["a--b/c", "a/b..c", "a/b@../../etc", "a/b@x//y"] {
            assert!(matches!(HubId::parse(refused), Some(Err(_))), "{refused}");
        }
    }

    #[test]
    fn urls_are_quoted_as_hf_hub_url_quotes_them() {
        assert_eq!(quote("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(quote("sub dir/model.safetensors", true), "sub%20dir/model.safetensors");
    }
}
