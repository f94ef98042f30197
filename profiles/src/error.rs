//! The error every loader in this crate returns for bad input: which file or flag, where in it
//! (line and column, or a key), what is wrong, and the fix when one is known.

use std::fmt;

/// Where in an input the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// 1-based line and column in a text file.
    LineColumn {
        /// 1-based line number.
        line: u64,
        /// 1-based column number.
        column: u64,
    },
    /// A key path such as `num_hidden_layers` or `devices[1].memory`.
    Key(String),
}

/// Bad input: printed as `origin:line:column: problem` (or `origin: key \`k\`: problem`), then the
/// fix on its own line. The command line maps it to exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// The file, flag or built-in name the input came from.
    pub origin: String,
    /// Where in the input the problem is; `None` when the whole input (or the flag's value) is.
    pub location: Option<Location>,
    /// What is wrong, including what was expected.
    pub problem: String,
    /// How to fix it, when known.
    pub fix: Option<String>,
}

impl InputError {
    /// An error in the input from `origin` (a file path, a flag such as `--gpus`, a built-in
    /// name), with no location or fix yet; add them with [`InputError::at_key`],
    /// [`InputError::at_line`] and [`InputError::with_fix`].
    pub fn new(origin: impl Into<String>, problem: impl Into<String>) -> Self {
        InputError { origin: origin.into(), location: None, problem: problem.into(), fix: None }
    }

    /// The same error at a key path (`num_hidden_layers`, `devices[0].memory`).
    pub fn at_key(mut self, key: impl Into<String>) -> Self {
        self.location = Some(Location::Key(key.into()));
        self
    }

    /// The same error at a 1-based line and column.
    pub fn at_line(mut self, line: u64, column: u64) -> Self {
        self.location = Some(Location::LineColumn { line, column });
        self
    }

    /// The same error with `fix`, printed on its own line as `fix: ...`.
    pub fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// This error, met in what `origin`'s `key` names (a plan file's `model` or `hardware`):
    /// reported at that key of `origin`, the error as it was its problem, the fix kept.
    pub fn inside(self, origin: impl Into<String>, key: impl Into<String>) -> Self {
        let fix = self.fix.clone();
        let inner = InputError { fix: None, ..self };
        InputError {
            origin: origin.into(),
            location: Some(Location::Key(key.into())),
            problem: inner.to_string(),
            fix,
        }
    }

    /// An error reading a file from disk (missing, unreadable).
    pub fn io(path: &std::path::Path, err: &std::io::Error) -> Self {
        let problem = match err.kind() {
            std::io::ErrorKind::NotFound => "no such file or folder".to_string(),
            _ => format!("cannot read: {err}"),
        };
        InputError::new(path.display().to_string(), problem)
    }

    /// A JSON syntax or type error, located at serde_json's line and column.
    pub fn json(origin: impl Into<String>, err: &serde_json::Error) -> Self {
        let mut text = err.to_string();
        // serde_json appends " at line L column C"; the location is printed separately.
        if let Some(pos) = text.rfind(" at line ") {
            text.truncate(pos);
        }
        let e = InputError::new(origin, format!("malformed JSON: {text}"));
        if err.line() > 0 { e.at_line(err.line() as u64, err.column() as u64) } else { e }
    }

    /// A YAML error in a `what` file (`hardware profile`, `workload`, ...), located where
    /// serde-saphyr says, with `fix` (where the schema is documented) as the fix. A schema error
    /// (an unknown or missing key, a value of the wrong type) keeps serde's words, a scalar of the
    /// wrong type said in words; a syntax error reads "malformed `what` YAML: ...". The location
    /// and source snippet are printed separately, not in the problem.
    pub fn yaml(
        origin: impl Into<String>,
        err: &serde_saphyr::Error,
        what: &str,
        fix: impl Into<String>,
    ) -> Self {
        use serde_saphyr::MessageFormatter;
        let inner = err.without_snippet();
        let message = serde_saphyr::DefaultMessageFormatter.format_message(inner);
        let message: String = message.chars().filter(|c| !c.is_control()).collect();
        let schema = ["unknown field", "missing field", "unknown variant", "invalid "];
        let problem = if matches!(inner, serde_saphyr::Error::Message { .. })
            || schema.iter().any(|s| message.starts_with(s))
        {
            plain_problem(&message)
        } else {
            format!("malformed {what} YAML: {message}")
        };
        let e = InputError::new(origin, problem).with_fix(fix);
        match err.location() {
            Some(loc) if loc.line() > 0 => e.at_line(loc.line(), loc.column()),
            _ => e,
        }
    }
}

/// serde's terse messages for a scalar of the wrong type, said in words.
fn plain_problem(problem: &str) -> String {
    let expected = match problem.trim() {
        "invalid u64" | "invalid u32" | "invalid u8" => "a whole number of 0 or more",
        "invalid f64" | "invalid f32" => "a number",
        "invalid bool" => "true or false",
        _ => return problem.to_string(),
    };
    format!("{problem}: expected {expected}")
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Some(Location::LineColumn { line, column }) => {
                write!(f, "{}:{}:{}: {}", self.origin, line, column, self.problem)?
            }
            Some(Location::Key(key)) => write!(f, "{}: key `{}`: {}", self.origin, key, self.problem)?,
            None => write!(f, "{}: {}", self.origin, self.problem)?,
        }
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

impl std::error::Error for InputError {}
