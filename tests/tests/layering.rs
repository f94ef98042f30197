//! ARCHITECTURE.md's layering, checked: its crate sections are in dependency order ("arrows only
//! point down this table"), so a crate's `Cargo.toml` may depend only on crates whose sections
//! come before its own.

use std::path::Path;

/// The crate folders in the order ARCHITECTURE.md lists them (`### \`folder/\` — \`name\``).
fn documented_order(root: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("### `")?;
            let (folder, rest) = rest.split_once("/` — `")?;
            let name = rest.strip_suffix('`')?;
            Some((folder.to_string(), name.to_string()))
        })
        .collect()
}

/// The workspace crates a `Cargo.toml` names under `[dependencies]`.
fn dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependencies = false;
    let mut found = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies
            && let Some((name, _)) = line.split_once(['.', ' ', '='])
            && (name == "vramplan" || name.starts_with("vramplan-"))
        {
            found.push(name.to_string());
        }
    }
    found
}

#[test]
fn crates_depend_only_on_crates_listed_before_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let order = documented_order(root);
    let names: Vec<&str> = order.iter().map(|(_, name)| name.as_str()).collect();
    for required in [
        "vramplan-hub",
        "vramplan-profiles",
        "vramplan-sim",
        "vramplan-solver",
        "vramplan-validate",
        "vramplan-reports",
        "vramplan-api",
        "vramplan",
        "vramplan-python",
    ] {
        assert!(names.contains(&required), "ARCHITECTURE.md has no section for {required}: {names:?}");
    }
    let mut violations = Vec::new();
    for (position, (folder, name)) in order.iter().enumerate() {
        let Ok(manifest) = std::fs::read_to_string(root.join(folder).join("Cargo.toml")) else { continue };
        for dependency in dependencies(&manifest) {
            match names.iter().position(|n| *n == dependency) {
                Some(p) if p < position => {}
                _ => violations
                    .push(format!("{name} depends on {dependency}, listed after it (or not at all)")),
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}
