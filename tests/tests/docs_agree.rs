//! The figures and examples of README.md and docs/ are the binary's own: every block marked
//! `<!-- vramplan: ARGS -->` above a ```text fence is what `vramplan ARGS` prints now (run from the
//! repository's root; a plan's solver time, which varies run to run, is left out of both sides).
//! `scripts/docs` rewrites the blocks from the binary (`VRAMPLAN_UPDATE_DOCS=1`), and this test
//! fails on any block that differs, so CI catches a figure that drifted.

use vramplan_tests::vramplan;

/// One generated block: the file, the arguments, where its text starts and ends (bytes).
struct Block {
    args: String,
    start: usize,
    end: usize,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("<!-- vramplan: ") {
        let open = at + i;
        let close = open + text[open..].find("-->").expect("a marker ends with -->");
        let args = text[open + "<!-- vramplan: ".len()..close].trim().to_string();
        let fence = close + text[close..].find("```text\n").expect("a ```text fence follows the marker");
        let start = fence + "```text\n".len();
        let end = start + text[start..].find("```").expect("the fence closes");
        out.push(Block { args, start, end });
        at = end;
    }
    out
}

/// What the block should hold: the command's output, a plan's solver time left out.
fn output(root: &std::path::Path, args: &str) -> String {
    let argv: Vec<String> = args
        .split_whitespace()
        .map(|a| if a.starts_with("docs/") { root.join(a).display().to_string() } else { a.to_string() })
        .collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = vramplan(&argv);
    assert!(out.code <= 1, "vramplan {args}: exit {}\n{}", out.code, out.stderr);
    let text = out.stdout.replace(&format!("{}/", root.display()), "");
    normalize(&text)
}

fn normalize(text: &str) -> String {
    let lines: Vec<&str> = text
        .trim_end()
        .lines()
        .map(|l| if l.starts_with("plan for ") { l.split("  (solver").next().unwrap_or(l) } else { l })
        .collect();
    lines.join("\n") + "\n"
}

#[test]
fn every_generated_block_in_the_docs_is_what_the_binary_prints() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("root");
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    let update = std::env::var_os("VRAMPLAN_UPDATE_DOCS").is_some();
    let mut stale = Vec::new();
    let mut count = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read doc");
        let mut rewritten = text.clone();
        // From the last block back, so that earlier offsets stay valid while rewriting.
        for block in blocks(&text).iter().rev() {
            count += 1;
            let now = output(&root, &block.args);
            if normalize(&text[block.start..block.end]) != now {
                stale.push(format!("{}: `vramplan {}`", file.display(), block.args));
                rewritten.replace_range(block.start..block.end, &now);
            }
        }
        if update && rewritten != text {
            std::fs::write(&file, rewritten).expect("write doc");
        }
    }
    assert!(count >= 3, "only {count} generated blocks");
    assert!(
        update || stale.is_empty(),
        "{} blocks differ from the binary; run scripts/docs:\n{}",
        stale.len(),
        stale.join("\n")
    );
}
