//! One GET to the Hub, bounded: the token sent to the endpoint only, redirects followed by hand
//! (the Hub answers a `resolve` URL of an LFS file with a 302 to a CDN; the `Range` header is
//! kept, the token dropped when the host changes, as `huggingface_hub` drops it), transient
//! failures retried with backoff (connection errors, timeouts, 408, 429, 5xx:
//! `utils/_http._DEFAULT_RETRY_ON_STATUS_CODES`), a timeout on connecting and on each answer,
//! and the body read up to a limit. Every request and byte is counted in the [`Activity`].

use crate::{Activity, HubError, Settings};
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ureq::http::{HeaderMap, StatusCode};

/// Redirects followed before giving up (ureq's and requests' default is 10 or more; the Hub uses
/// one or two).
const MAX_REDIRECTS: usize = 10;
/// Attempts of one request when failures are transient (`huggingface_hub` retries up to 5 times
/// with 1 to 8 s between; fewer here, since a user waits on the command line).
const ATTEMPTS: u32 = 4;
/// The first wait between attempts, doubled each time.
const FIRST_WAIT: Duration = Duration::from_millis(250);
/// The longest wait between attempts, `Retry-After` included.
const MAX_WAIT: Duration = Duration::from_secs(8);
/// Bound on a whole exchange, body included (a small file or a header range).
const WHOLE_REQUEST: Duration = Duration::from_secs(120);

/// An answer read.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The final status, after redirects.
    pub status: u16,
    /// The final answer's headers; `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size` are taken
    /// from the first (the Hub's) answer when a redirect dropped them.
    pub headers: HeaderMap,
    /// The body, up to the limit asked for.
    pub body: Vec<u8>,
}

impl Answer {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The HTTP side of a [`crate::Hub`].
#[derive(Debug)]
pub(crate) struct Client {
    agent: ureq::Agent,
    endpoint: String,
    endpoint_host: String,
    token: Option<String>,
    activity: Arc<Mutex<Activity>>,
}

/// What one attempt gave.
enum Attempt {
    Done(Answer),
    /// Worth another try: the wait the server asked for, the status (none: no answer), and
    /// what went wrong.
    Transient(Option<Duration>, Option<u16>, String),
    Failed(HubError),
}

impl Client {
    pub fn new(settings: &Settings, activity: Arc<Mutex<Activity>>) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(settings.timeout))
            .timeout_recv_response(Some(settings.timeout))
            .timeout_global(Some(WHOLE_REQUEST))
            .user_agent(concat!("vramplan/", env!("CARGO_PKG_VERSION"), "; hf_hub-compatible"))
            .build();
        Client {
            agent: config.into(),
            endpoint: settings.endpoint.clone(),
            endpoint_host: host_of(&settings.endpoint).to_string(),
            token: settings.token.as_ref().map(|(token, _)| token.clone()),
            activity,
        }
    }

    /// GETs `url`, bytes `range` (first, last) if given, reading at most `limit` bytes of body.
    pub fn get(&self, url: &str, range: Option<(u64, u64)>, limit: u64) -> Result<Answer, HubError> {
        let mut wait = FIRST_WAIT;
        let mut attempt = 1;
        loop {
            match self.attempt(url, range, limit) {
                Attempt::Done(answer) => return Ok(answer),
                Attempt::Failed(e) => return Err(e),
                Attempt::Transient(asked, status, detail) => {
                    if attempt >= ATTEMPTS {
                        return Err(match status {
                            Some(status) => HubError::Status {
                                url: url.to_string(),
                                status,
                                message: Some(format!("still failing after {ATTEMPTS} attempts")),
                            },
                            None => HubError::Unreachable {
                                endpoint: self.endpoint.clone(),
                                url: url.to_string(),
                                detail: format!("{detail}, {ATTEMPTS} attempts"),
                            },
                        });
                    }
                    let pause = asked.unwrap_or(wait).min(MAX_WAIT);
                    self.log(format!("retry in {} ms: {detail}", pause.as_millis()));
                    std::thread::sleep(pause);
                    wait = (wait * 2).min(MAX_WAIT);
                    attempt += 1;
                }
            }
        }
    }

    fn attempt(&self, url: &str, range: Option<(u64, u64)>, limit: u64) -> Attempt {
        let mut current = url.to_string();
        let mut first_headers: Option<HeaderMap> = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.agent.get(&current).header("Accept-Encoding", "identity");
            if let Some((first, last)) = range {
                request = request.header("Range", format!("bytes={first}-{last}"));
            }
            if let Some(token) = &self.token
                && host_of(&current) == self.endpoint_host
            {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            let response = match request.call() {
                Ok(response) => response,
                Err(e) => {
                    self.count(&current, range, None, 0);
                    return match e {
                        ureq::Error::BadUri(_) | ureq::Error::Http(_) => {
                            Attempt::Failed(HubError::Protocol {
                                url: current,
                                problem: format!("not a URL the client can ask: {e}"),
                            })
                        }
                        e => Attempt::Transient(None, None, transport_detail(&e)),
                    };
                }
            };
            let status = response.status();
            if status.is_redirection() {
                self.count(&current, range, Some(status), 0);
                let Some(location) = response.headers().get("Location").and_then(|v| v.to_str().ok()) else {
                    return Attempt::Failed(HubError::Protocol {
                        url: current,
                        problem: format!("HTTP {} without a Location", status.as_u16()),
                    });
                };
                let next = join_url(&current, location);
                first_headers.get_or_insert_with(|| response.headers().clone());
                current = next;
                continue;
            }
            let mut headers = response.headers().clone();
            if let Some(first) = &first_headers {
                for name in
                    ["X-Repo-Commit", "X-Linked-Etag", "X-Linked-Size", "X-Error-Code", "X-Error-Message"]
                {
                    if !headers.contains_key(name)
                        && let Some(value) = first.get(name)
                    {
                        headers.insert(name, value.clone());
                    }
                }
            }
            if is_transient(status) {
                self.count(&current, range, Some(status), 0);
                let asked = headers
                    .get("Retry-After")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                return Attempt::Transient(
                    asked,
                    Some(status.as_u16()),
                    format!("HTTP {} from {current}", status.as_u16()),
                );
            }
            // Only the bytes asked for: a server that ignores `Range` sends the whole file, of
            // which only the start is read before the connection is dropped.
            let mut body = Vec::new();
            let read =
                response.into_body().into_reader().take(limit.saturating_add(1)).read_to_end(&mut body);
            self.count(&current, range, Some(status), body.len() as u64);
            if let Err(e) = read {
                return Attempt::Transient(None, None, format!("reading the answer from {current}: {e}"));
            }
            return Attempt::Done(Answer { status: status.as_u16(), headers, body });
        }
        Attempt::Failed(HubError::Protocol {
            url: url.to_string(),
            problem: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }

    fn count(&self, url: &str, range: Option<(u64, u64)>, status: Option<StatusCode>, bytes: u64) {
        let range = range.map(|(a, b)| format!(" bytes={a}-{b}")).unwrap_or_default();
        let status = status.map_or("no answer".to_string(), |s| s.as_u16().to_string());
        // A CDN's signed query string is a credential for a while: not printed.
        let url = url.split('?').next().unwrap_or(url);
        if let Ok(mut activity) = self.activity.lock() {
            activity.requests += 1;
            activity.bytes_read += bytes;
            activity.lines.push(format!("GET {url}{range} -> {status}, {bytes} bytes"));
        }
    }

    fn log(&self, line: String) {
        if let Ok(mut activity) = self.activity.lock() {
            activity.lines.push(line);
        }
    }
}

/// 408, 429 and 5xx: worth another try (`_DEFAULT_RETRY_ON_STATUS_CODES` and the other 5xx).
fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429) || status.is_server_error()
}

/// What a transport error means, in words.
fn transport_detail(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(what) => format!("timed out ({what})"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Io(io) => format!("{io}"),
        other => other.to_string(),
    }
}

/// `scheme://host[:port]` of a URL.
fn host_of(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    let end = url[after..].find('/').map_or(url.len(), |i| after + i);
    &url[..end]
}

/// A `Location` resolved against the URL it answered: absolute, host-relative (`/x`) or
/// path-relative.
fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    if location.starts_with('/') {
        return format!("{}{location}", host_of(base));
    }
    let path_end = base.find('?').unwrap_or(base.len());
    let folder_end = base[..path_end].rfind('/').map_or(base.len(), |i| i + 1);
    format!("{}{location}", &base[..folder_end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_the_url_they_answer() {
        let base = "http://127.0.0.1:80/org/name/resolve/main/x.safetensors";
        assert_eq!(host_of(base), "http://127.0.0.1:80");
        assert_eq!(join_url(base, "https://cdn.example/b?sig=1"), "https://cdn.example/b?sig=1");
        assert_eq!(join_url(base, "/api/x"), "http://127.0.0.1:80/api/x");
        assert_eq!(
            join_url(base, "y.safetensors"),
            "http://127.0.0.1:80/org/name/resolve/main/y.safetensors"
        );
    }
}
