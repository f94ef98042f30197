//! A grid's points are bounded (issue 32): `whatif grid` and `plot grid` whose axes are each
//! within their bound but whose product is 10⁸ points are refused before any point is probed,
//! with the product, the bound and the fix (docs/limits.md, "Grids"); a grid at the bound runs.

use std::time::{Duration, Instant};
use vramplan_tests::{assert_refused, vramplan};

#[test]
fn a_grid_past_the_bound_on_its_points_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("grid.svg").display().to_string();
    let axes = ["--batch", "1..10000+1", "--seq", "1..10000+1"];
    for head in [vec!["whatif", "grid"], vec!["plot", "grid"]] {
        let mut args: Vec<&str> = head.clone();
        args.extend(["llama-3.2-1b", "--hardware", "1xa100-80gb"]);
        args.extend(axes);
        if head[0] == "plot" {
            args.extend(["-o", &svg]);
        }
        let start = Instant::now();
        let out = vramplan(&args);
        assert!(start.elapsed() < Duration::from_secs(5), "{head:?} took {:?}", start.elapsed());
        assert_refused(
            &out,
            &[&format!("{} {}", head[0], head[1]), "100000000 points (10000 × 10000)", "more than 10000"],
        );
    }
    // Three axes, each small, their product past the bound.
    let out = vramplan(&[
        "whatif",
        "grid",
        "llama-3.2-1b",
        "--hardware",
        "1xa100-80gb,2xa100-80gb",
        "--batch",
        "1..101+1",
        "--seq",
        "1..101+1",
    ]);
    assert_refused(&out, &["20402 points (101 × 101 × 2)", "more than 10000"]);
}

#[test]
fn an_axis_listed_past_the_bound_is_refused() {
    let list: Vec<String> = (1..=10_001).map(|v| v.to_string()).collect();
    let list = list.join(",");
    let out = vramplan(&["whatif", "grid", "llama-3.2-1b", "--hardware", "1xa100-80gb", "--batch", &list]);
    assert_refused(&out, &["--batch", "10001 values, more than 10000"]);
}

#[test]
fn a_grid_at_the_bound_runs() {
    let out = vramplan(&[
        "whatif",
        "grid",
        "llama-3.2-1b",
        "--hardware",
        "1xa100-80gb",
        "--batch",
        "1..100+1",
        "--seq",
        "512..51200+512",
        "--json",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.json()["points"].as_array().map(Vec::len), Some(10_000));
}
