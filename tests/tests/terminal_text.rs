//! Text from input files reaches a terminal escaped (issue 32): a price table's currency, a
//! custom model's name and class, a path in an error message, each holding an escape sequence
//! (`ESC [ 31 m`), are printed as `\x1b[31m`, and no control character but newline and tab is
//! printed at all.

use vramplan_tests::{Output, vramplan, write};

/// No byte of the output is a control character other than newline and tab.
fn assert_no_controls(out: &Output) {
    for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let bad = text.chars().find(|c| c.is_control() && *c != '\n' && *c != '\t');
        assert!(bad.is_none(), "{stream} holds {bad:?}:\n{text}");
    }
}

#[test]
fn a_price_tables_currency_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let prices = write(
        dir.path(),
        "prices.yaml",
        "currency: \"\\x1b[31mUSD\"\nprices:\n  a100-80gb: {per_gpu_hour: 4.1}\n  t4: {per_gpu_hour: 0.5}\n",
    );
    let out = vramplan(&[
        "whatif",
        "cheapest",
        "llama-3.2-1b",
        "--hardware",
        "1xa100-80gb,1xt4",
        "--prices",
        &prices,
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("\\x1b[31mUSD/hour"), "{}", out.stdout);
    assert_no_controls(&out);
}

#[test]
fn a_custom_models_names_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let model = write(
        dir.path(),
        "evil.yaml",
        "name: \"tst\\x1b[2J\"\narchitecture: \"Evil\\x1b[31mNet\"\ndtype: fp32\nhidden_size: 16\n\
         attention_heads: 2\nintermediate_size: 32\nmax_positions: 64\nactivations:\n  per_token: 1KiB\n\
         modules:\n  - name: proj\n    block: true\n    linear: {in: 16, out: 16}\n",
    );
    let out = vramplan(&["inspect", &model]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("tst\\x1b[2J") && out.stdout.contains("Evil\\x1b[31mNet"), "{}", out.stdout);
    assert_no_controls(&out);
}

#[test]
fn a_path_quoted_in_an_error_is_escaped() {
    let out = vramplan(&[
        "estimate",
        "llama-3.2-1b",
        "--hardware",
        "1xt4",
        "--workload",
        "no-such-\u{1b}[31m.yaml",
    ]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("no-such-\\x1b[31m.yaml"), "{}", out.stderr);
    assert_no_controls(&out);
}

#[test]
fn drawings_and_reports_hold_no_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = write(
        d,
        "evil.yaml",
        "name: \"tst\\x1b[2J\"\narchitecture: \"Evil\\x1b[31mNet\"\ndtype: fp32\nhidden_size: 16\n\
         attention_heads: 2\nintermediate_size: 32\nmax_positions: 64\nactivations:\n  per_token: 1KiB\n\
         modules:\n  - name: proj\n    block: true\n    linear: {in: 16, out: 16}\n",
    );
    let svg = d.join("b.svg").display().to_string();
    let md = d.join("r.md").display().to_string();
    let html = d.join("r.html").display().to_string();
    for args in [
        vec!["plot", "breakdown", model.as_str(), "--hardware", "1xt4", "-o", &svg],
        vec!["report", model.as_str(), "--hardware", "1xt4", "-o", &md],
        vec!["report", model.as_str(), "--hardware", "1xt4", "-o", &html],
    ] {
        let out = vramplan(&args);
        assert_eq!(out.code, 0, "{args:?}: {}", out.stderr);
    }
    for entry in std::fs::read_dir(d).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e != "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let bad = text.chars().find(|c| c.is_control() && *c != '\n' && *c != '\t');
            assert!(bad.is_none(), "{} holds {bad:?}", path.display());
            assert!(text.contains("tst\\x1b[2J"), "{} names the model", path.display());
        }
    }
}
