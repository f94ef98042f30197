//! Outputs of several files are written all-or-nothing (issue 32): `report -o r.md` writes the
//! document and its SVG drawings together; where one cannot be written (its path is a folder),
//! the command fails with exit 2, the older report and drawings are unchanged, and nothing new
//! (a drawing, a temporary file) is left beside them.

use std::path::Path;
use vramplan_tests::vramplan;

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_report_that_cannot_write_its_third_drawing_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let report = d.join("r.md").display().to_string();
    let args = ["report", "llama-3.2-1b", "--hardware", "2xa100-80gb", "-o", &report];
    // The drawings a whole report writes, from the command itself.
    let first = vramplan(&args);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let written = listing(d);
    assert!(written.len() >= 4, "the report and at least three drawings: {written:?}");
    // An older report: every file of it holds "old"; the last drawing's path becomes a folder.
    let drawings: Vec<&String> = written.iter().filter(|n| n.ends_with(".svg")).collect();
    let blocked = drawings.last().unwrap().to_string();
    for name in &written {
        std::fs::remove_file(d.join(name)).unwrap();
    }
    std::fs::write(d.join("r.md"), "old").unwrap();
    std::fs::write(d.join(drawings[0]), "old").unwrap();
    std::fs::create_dir(d.join(&blocked)).unwrap();
    let before = listing(d);

    let out = vramplan(&args);
    assert_eq!(out.code, 2, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains(&blocked), "{}", out.stderr);
    assert_eq!(listing(d), before, "nothing new beside the old report");
    assert_eq!(std::fs::read_to_string(d.join("r.md")).unwrap(), "old");
    assert_eq!(std::fs::read_to_string(d.join(drawings[0])).unwrap(), "old");
}
