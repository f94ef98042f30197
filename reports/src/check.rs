//! `vramplan check`'s report: the memory of each device under the map (the estimate's table, or
//! why it was not simulated), then the device mismatches the target runtime would hit, each
//! with its rule, the devices involved and the message wrapped to the terminal, and the verdict.

use crate::estimate_table;
use vramplan_sim::Estimate;
use vramplan_solver::Runtime;
use vramplan_solver::check::Finding;

/// Columns a finding's message is wrapped to.
const WIDTH: usize = 100;

/// The human report of a device-map check. `estimate` is `None` when memory was not simulated,
/// with the reason in `memory_skipped`.
pub fn check_table(
    target: Runtime,
    estimate: Option<&Estimate>,
    memory_skipped: Option<&str>,
    findings: &[Finding],
) -> String {
    let mut text = match (estimate, memory_skipped) {
        (Some(estimate), _) => estimate_table(estimate),
        (None, Some(why)) => format!("memory: not simulated: {why}\n"),
        (None, None) => String::new(),
    };
    text += "\n";
    if findings.is_empty() {
        text += &format!("device map: no mismatch for {}\n", target.name());
    } else {
        text += &format!(
            "device map: {} mismatch{} for {}:\n",
            findings.len(),
            if findings.len() == 1 { "" } else { "es" },
            target.name()
        );
        for (i, finding) in findings.iter().enumerate() {
            let devices = if finding.devices.is_empty() {
                String::new()
            } else {
                format!("  ({})", finding.devices.join(", "))
            };
            text += &format!("\n{:>3}. {}{devices}\n", i + 1, finding.rule);
            text += &wrap(&finding.message, "     ");
        }
    }
    let fits = estimate.map(|e| e.fits);
    text += &format!(
        "\ncheck: {}\n",
        match (findings.is_empty(), fits) {
            (true, Some(true)) => "ok, the map fits and loads as it is".to_string(),
            (true, Some(false)) => "the map loads, but does not fit".to_string(),
            (true, None) => "no mismatch; memory not simulated".to_string(),
            (false, Some(false)) => "the map does not fit and has mismatches to fix".to_string(),
            (false, _) => "the map has mismatches to fix".to_string(),
        }
    );
    text
}

/// `text` in lines of at most [`WIDTH`] columns (a longer word stands alone), each starting
/// with `indent`.
fn wrap(text: &str, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let len = |s: &str| s.chars().count();
        if !line.is_empty() && len(indent) + len(&line) + 1 + len(word) > WIDTH {
            out += &format!("{indent}{line}\n");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line += word;
    }
    if !line.is_empty() {
        out += &format!("{indent}{line}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramplan_solver::check::Rule;

    #[test]
    fn wraps_at_the_width_and_keeps_every_word() {
        let words: Vec<String> = (0..60).map(|i| format!("word{i}")).collect();
        let text = wrap(&words.join(" "), "  ");
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH && l.starts_with("  ")), "{text}");
        assert_eq!(text.split_whitespace().collect::<Vec<_>>(), words);
    }

    #[test]
    fn findings_are_numbered_with_rule_and_devices() {
        let finding = Finding {
            rule: Rule::TiedWeightsSplit,
            modules: vec!["transformer.wte".into(), "lm_head".into()],
            devices: vec!["GPU 0".into(), "GPU 1".into()],
            message: "Fix: put `lm_head` with `transformer.wte`.".into(),
        };
        let text = check_table(Runtime::Accelerate, None, Some("2 tensors are on no device"), &[finding]);
        assert!(text.starts_with("memory: not simulated: 2 tensors are on no device\n"), "{text}");
        assert!(text.contains("1 mismatch for accelerate:"), "{text}");
        assert!(text.contains("  1. tied-weights-split  (GPU 0, GPU 1)\n"), "{text}");
        assert!(text.contains("     Fix: put `lm_head`"), "{text}");
        assert!(text.ends_with("check: the map has mismatches to fix\n"), "{text}");
        let clean = check_table(Runtime::Pipeline, None, None, &[]);
        assert!(clean.contains("no mismatch for pipeline"), "{clean}");
    }
}
