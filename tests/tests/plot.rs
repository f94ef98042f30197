//! `vramplan plot`: the figures read back and held to the numbers they draw, taken from the
//! commands a user would run for them (`estimate --json`, `plan --json`, `whatif --json`) and
//! from the axis the figure itself labels: bar segments proportional to bytes within a pixel,
//! the capacity line at the capacity, one column per device and one box per unit, a plan's bars
//! at each GPU's peak reserved under the limit drawn for it with its runs of layers named, the
//! sweep's points at the estimates' peaks and a GPU's line kept to one device map (it never
//! falls), the grid's crosses where `whatif grid` says no; PNG decodes with the component
//! colours where the bars are; the same input gives the same bytes.

use serde_json::Value;
use vramplan_tests::{Output, assert_refused, vramplan, write};

/// One `<rect>` of an SVG.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Rect {
    x: i64,
    y: i64,
    width: i64,
    height: i64,
    fill: u32,
}

/// The value of `name="…"` in one element's text.
fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = element[start..].find('"')? + start;
    Some(&element[start..end])
}

/// Every element of `tag` in `svg`, as its text up to `>` (and its content for `<text>`).
fn elements<'a>(svg: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag} ");
    let mut found = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find(&open) {
        let end = rest[i..].find(if tag == "text" { "</text>" } else { ">" }).map_or(rest.len(), |e| i + e);
        found.push(&rest[i..end]);
        rest = &rest[end..];
    }
    found
}

fn hex(text: &str) -> u32 {
    u32::from_str_radix(text.trim_start_matches('#'), 16).expect("a #RRGGBB colour")
}

fn number(element: &str, name: &str) -> i64 {
    attribute(element, name).and_then(|v| v.parse::<f64>().ok()).expect("a numeric attribute") as i64
}

/// The filled rectangles, the legend's 14-pixel swatches and the background left out.
fn rects(svg: &str) -> Vec<Rect> {
    elements(svg, "rect")
        .into_iter()
        .map(|e| Rect {
            x: number(e, "x"),
            y: number(e, "y"),
            width: number(e, "width"),
            height: number(e, "height"),
            fill: hex(attribute(e, "fill").unwrap_or("#000000")),
        })
        .filter(|r| r.width != 14 && r.fill != 0xFFFFFF)
        .collect()
}

/// The texts, as (x, y, content).
fn texts(svg: &str) -> Vec<(i64, i64, String)> {
    elements(svg, "text")
        .into_iter()
        .map(|e| {
            let content = e[e.find('>').map_or(0, |i| i + 1)..].trim();
            (number(e, "x"), number(e, "y"), content.replace("&quot;", "\"").replace("&amp;", "&"))
        })
        .collect()
}

/// Whether some text of `svg` reads exactly `words`.
fn says(svg: &str, words: &str) -> bool {
    texts(svg).iter().any(|t| t.2 == words)
}

/// The y axis as the figure labels it: pixels per GiB and the pixel row of 0, from the tick
/// labels (right-aligned whole numbers at the left).
fn byte_axis(svg: &str) -> (f64, f64) {
    let ticks: Vec<(f64, f64)> = elements(svg, "text")
        .into_iter()
        .filter(|e| attribute(e, "text-anchor") == Some("end"))
        .filter_map(|e| {
            let content = &e[e.find('>')? + 1..];
            Some((content.trim().parse::<f64>().ok()?, number(e, "y") as f64))
        })
        .collect();
    assert!(ticks.len() >= 3, "the byte axis has labelled ticks: {ticks:?}");
    let (first, last) = (ticks[0], ticks[ticks.len() - 1]);
    let per_gib = (first.1 - last.1) / (last.0 - first.0);
    (per_gib, first.1 + first.0 * per_gib)
}

/// The horizontal lines of `colour` across the plot (the legend's short samples left out).
fn lines(svg: &str, colour: u32) -> Vec<(i64, i64, i64)> {
    elements(svg, "polyline")
        .into_iter()
        .filter(|e| attribute(e, "stroke").map(hex) == Some(colour))
        .filter_map(|e| {
            let points: Vec<(i64, i64)> = attribute(e, "points")?
                .split_whitespace()
                .filter_map(|p| p.split_once(','))
                .map(|(x, y)| (x.parse().unwrap_or(0), y.parse().unwrap_or(0)))
                .collect();
            let (a, b) = (points.first()?, points.last()?);
            (a.1 == b.1 && b.0 - a.0 > 40).then_some((a.0, b.0, a.1))
        })
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

fn plot(args: &[&str], path: &str) -> Output {
    let out = vramplan(&[&["plot"], args, &["-o", path]].concat());
    assert_eq!(out.code, 0, "plot {args:?}: {}", out.stderr);
    out
}

fn run_json(args: &[&str]) -> Value {
    vramplan(args).json()
}

const PYTHIA: [&str; 15] = [
    "pythia-2.8b",
    "--hardware",
    "t4x2",
    "--mode",
    "train",
    "--lora-rank",
    "16",
    "--dtype",
    "fp16",
    "--grad-ckpt",
    "full",
    "--batch",
    "4",
    "--seq",
    "1024",
];

/// Component colours in the order the bars stack them (weights at the bottom).
const PARTS: [(&str, u32); 7] = [
    ("weights", 0x0072B2),
    ("gradients", 0xE69F00),
    ("optimizer", 0x009E73),
    ("activations", 0xCC79A7),
    ("kv_cache", 0x56B4E9),
    ("logits", 0xD55E00),
    ("overhead", 0xA0A0A0),
];

#[test]
fn breakdown_bars_are_the_estimates_components_against_the_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("b.svg").display().to_string();
    plot(&[&["breakdown"], &PYTHIA[..]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let estimate = run_json(&[&["estimate"], &PYTHIA[..], &["--json"]].concat());
    let devices = estimate["devices"].as_array().unwrap();
    let (per_gib, zero) = byte_axis(&svg);
    let bars = rects(&svg);
    // One column per device: the component segments stand at as many x positions.
    let mut columns: Vec<i64> =
        bars.iter().filter(|r| PARTS.iter().any(|p| p.1 == r.fill)).map(|r| r.x).collect();
    columns.sort();
    columns.dedup();
    assert_eq!(columns.len(), devices.len(), "{columns:?}");
    for (device, x) in devices.iter().zip(&columns) {
        let mut bottom = zero;
        for (part, colour) in PARTS {
            let bytes = device["components"][part].as_u64().unwrap();
            let segment = bars.iter().find(|r| r.x == *x && r.fill == colour);
            let Some(segment) = segment else {
                assert_eq!(bytes, 0, "GPU {}: no {part} segment for {bytes} bytes", device["id"]);
                continue;
            };
            let expected = bytes as f64 / GIB * per_gib;
            assert!(
                (segment.height as f64 - expected).abs() <= 1.0,
                "GPU {} {part}: {} px for {bytes} bytes ({expected:.1} px)",
                device["id"],
                segment.height
            );
            assert!(
                ((segment.y + segment.height) as f64 - bottom).abs() <= 1.0,
                "{part} sits on the one below"
            );
            bottom = segment.y as f64;
        }
        // The capacity line at the capacity, over this column.
        let capacity = device["capacity_bytes"].as_u64().unwrap() as f64 / GIB;
        let line =
            lines(&svg, 0xB00020).into_iter().find(|l| l.0 <= *x && l.1 >= *x).expect("a capacity line");
        assert!((line.2 as f64 - (zero - capacity * per_gib)).abs() <= 1.0, "capacity at {} px", line.2);
        // The peak event is named under it.
        let at = device["peak_at"].as_str().unwrap();
        let words: Vec<String> = texts(&svg).into_iter().map(|t| t.2).collect();
        assert!(words.join(" ").contains(&format!("peak: {at}")), "{at} is named");
    }
}

#[test]
fn breakdown_draws_what_a_validation_measured_beside_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    // A validation's result as `validate --json` writes it (its run's device peaks).
    let measured = r#"{"findings": [], "ok": true, "run": {"backend": "cuda", "outcome": {"kind": "completed"},
        "samples": [], "placed": {}, "devices": [
        {"device": 0, "name": "Tesla T4", "allocated_bytes": 3000000000, "reserved_bytes": 3500000000,
         "driver_used_bytes": 4000000000, "driver_used_before_bytes": 300000000, "peak_event": "x"},
        {"device": 1, "name": "Tesla T4", "allocated_bytes": 5000000000, "reserved_bytes": 5200000000,
         "driver_used_bytes": 5800000000, "driver_used_before_bytes": 300000000, "peak_event": "y"}]}}"#;
    let file = write(dir.path(), "run.json", measured);
    let svg_path = dir.path().join("m.svg").display().to_string();
    plot(&[&["breakdown"], &PYTHIA[..], &["--measured", &file]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let (per_gib, _) = byte_axis(&svg);
    let bars = rects(&svg);
    for (colour, heights) in
        [(0x3B3B5C, [3.0e9, 5.0e9]), (0x8C8CB4, [0.5e9, 0.2e9]), (0xC8C8DC, [0.5e9, 0.6e9])]
    {
        let mut drawn: Vec<&Rect> = bars.iter().filter(|r| r.fill == colour).collect();
        drawn.sort_by_key(|r| r.x);
        assert_eq!(drawn.len(), 2, "one measured segment of #{colour:06X} per device");
        for (rect, bytes) in drawn.iter().zip(heights) {
            assert!((rect.height as f64 - bytes / GIB * per_gib).abs() <= 1.0, "{rect:?} for {bytes} bytes");
        }
    }
    assert!(says(&svg, "predicted") && says(&svg, "measured"));
}

/// Measured peaks that cannot be this plan's are refused, not drawn or dropped: a GPU the
/// estimate lacks, a GPU measured twice, a peak past the GPU's memory (2⁶⁴ − 1 bytes), peak
/// allocated above peak reserved.
#[test]
fn measured_peaks_that_are_not_this_plans_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let device = |id: u32, allocated: u64, reserved: u64| {
        format!(
            r#"{{"device": {id}, "name": "Tesla T4", "allocated_bytes": {allocated}, "reserved_bytes": {reserved},
            "driver_used_bytes": 4000000000, "driver_used_before_bytes": 300000000, "peak_event": "x"}}"#
        )
    };
    let result = |devices: &[String]| {
        format!(r#"{{"findings": [], "ok": true, "run": {{"devices": [{}]}}}}"#, devices.join(", "))
    };
    let cases = [
        (
            "other.json",
            result(&[device(0, 1, 2), device(5, 1, 2)]),
            &["other.json", "GPU 5 was measured", "0, 1"][..],
        ),
        (
            "twice.json",
            result(&[device(0, 1, 2), device(0, 1, 2)]),
            &["twice.json", "GPU 0 is measured twice"][..],
        ),
        (
            "huge.json",
            result(&[device(1, 1, u64::MAX)]),
            &["huge.json", "`reserved_bytes` of GPU 1", "more than"][..],
        ),
        ("inverted.json", result(&[device(0, 3, 2)]), &["inverted.json", "exceed its peak reserved"][..]),
    ];
    for (name, text, says) in cases {
        let file = write(dir.path(), name, &text);
        let svg = dir.path().join("m.svg").display().to_string();
        let out =
            vramplan(&[&["plot", "breakdown"], &PYTHIA[..], &["--measured", &file, "-o", &svg]].concat());
        assert_refused(&out, says);
        assert_eq!(out.code, 2, "{name}: {}", out.stderr);
    }
}

#[test]
fn plan_draws_one_column_per_device_and_one_box_per_unit_beside_accelerates_map() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = ["mixtral-8x7b", "--hardware", "t4x2", "--quant", "nf4", "--target", "accelerate-v4"];
    let svg_path = dir.path().join("p.svg").display().to_string();
    plot(&[&["plan"], &inputs[..], &["--baseline"]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let planned = run_json(&[&["plan"], &inputs[..], &["--json"]].concat());
    let units = |plan: &Value| -> Vec<usize> {
        plan["devices"].as_array().unwrap().iter().map(|d| d["units"].as_array().unwrap().len()).collect()
    };
    let (ours, accelerate) = (units(&planned), units(&planned["baseline"]));
    let boxes: Vec<Rect> =
        rects(&svg).into_iter().filter(|r| r.fill == 0x0072B2 || r.fill == 0x5AA8D8).collect();
    let mut columns: Vec<i64> = boxes.iter().map(|r| r.x).collect();
    columns.sort();
    columns.dedup();
    assert_eq!(columns.len(), ours.len() + accelerate.len(), "one column per device of both maps");
    // accelerate's map on the left, ours on the right; each column holds its device's units.
    let expected: Vec<usize> = accelerate.iter().chain(&ours).copied().collect();
    let drawn: Vec<usize> = columns.iter().map(|x| boxes.iter().filter(|r| r.x == *x).count()).collect();
    assert_eq!(drawn, expected);
    // accelerate's second GPU runs over its limit, ours does not: the dashed limit lines show it.
    assert!(says(&svg, "accelerate device_map=\"auto\"") && says(&svg, "vramplan plan"));
}

#[test]
fn sweep_points_are_each_estimates_peak_and_the_crossing_is_whatifs_answer() {
    let dir = tempfile::tempdir().unwrap();
    let model = format!("{}/../docs/examples/timeseries-transformer.yaml", env!("CARGO_MANIFEST_DIR"));
    // 512 tokens: the model's learned table of positions.
    let base = [model.as_str(), "--hardware", "rtx4090", "--mode", "train", "--seq", "512"];
    let svg_path = dir.path().join("s.svg").display().to_string();
    plot(&[&["sweep"], &base[..], &["--batch", "8..512"]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let answer = run_json(&[&["whatif", "max-batch"], &base[..], &["--json"]].concat());
    let (value, next) = (answer["value"].as_u64().unwrap(), answer["next"].as_u64().unwrap());
    assert!(says(&svg, &format!("largest that fits: {value} ({next} does not)")), "the crossing is labelled");
    let (per_gib, zero) = byte_axis(&svg);
    let mut points: Vec<(i64, i64)> = elements(&svg, "circle")
        .into_iter()
        .filter(|e| attribute(e, "r") == Some("3"))
        .map(|e| (number(e, "cx"), number(e, "cy")))
        .collect();
    points.sort();
    let batches = [8, 16, 32, 64, 128, 256, 512, value, next];
    assert_eq!(points.len(), batches.len(), "a point per batch probed and the boundary's two");
    for (batch, (_, cy)) in batches.iter().zip(&points) {
        let estimate =
            run_json(&[&["estimate"], &base[..], &["--batch", &batch.to_string(), "--json"]].concat());
        let reserved = estimate["devices"][0]["peak_reserved_bytes"].as_u64().unwrap() as f64 / GIB;
        assert!(
            (*cy as f64 - (zero - reserved * per_gib)).abs() <= 1.0,
            "batch {batch}: {cy} px for {reserved:.2} GiB"
        );
    }
}

#[test]
fn grid_marks_the_cells_whatif_grid_says_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["qwen2.5-0.5b", "--hardware", "t4", "--mode", "train", "--lora-rank", "16"];
    let axes = ["--batch", "1..64", "--seq", "512..16384"];
    let svg_path = dir.path().join("g.svg").display().to_string();
    plot(&[&["grid"], &base[..], &axes[..]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let grid = run_json(&[&["whatif", "grid"], &base[..], &axes[..], &["--json"]].concat());
    let points = grid["points"].as_array().unwrap();
    let over = points.iter().filter(|p| p["fits"] == false).count();
    assert!(over > 0 && over < points.len());
    let cells = rects(&svg);
    assert_eq!(
        cells.iter().filter(|r| r.fill == 0xD55E00).count(),
        over,
        "a red cell per point that does not fit"
    );
    assert_eq!(texts(&svg).iter().filter(|t| t.2 == "×").count(), over, "a cross in each");
    let side = cells.iter().filter(|r| r.fill == 0xD55E00).map(|r| r.width).max().unwrap();
    assert_eq!(cells.iter().filter(|r| r.width == side).count(), points.len(), "a cell per point");
}

#[test]
fn the_same_input_gives_the_same_svg_and_png_decodes_with_the_bar_colours() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.svg"), dir.path().join("b.svg"));
    plot(&[&["breakdown"], &PYTHIA[..]].concat(), &a.display().to_string());
    plot(&[&["breakdown"], &PYTHIA[..]].concat(), &b.display().to_string());
    let svg = std::fs::read(&a).unwrap();
    assert_eq!(svg, std::fs::read(&b).unwrap(), "byte-identical SVG");
    let png_path = dir.path().join("b.png");
    plot(&[&["breakdown"], &PYTHIA[..]].concat(), &png_path.display().to_string());
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png_path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let svg = String::from_utf8(svg).unwrap();
    assert_eq!((info.width as i64, info.height as i64), (number(&svg, "width"), number(&svg, "height")));
    // The PNG draws what the SVG draws: each bar segment's middle has its colour.
    for rect in rects(&svg).into_iter().filter(|r| r.height >= 3 && PARTS.iter().any(|p| p.1 == r.fill)) {
        let (x, y) = (rect.x + rect.width / 2, rect.y + rect.height / 2);
        let i = (y as usize * info.width as usize + x as usize) * 3;
        let colour = u32::from_be_bytes([0, pixels[i], pixels[i + 1], pixels[i + 2]]);
        assert_eq!(colour, rect.fill, "pixel ({x}, {y})");
    }
    // Text was drawn: the title's row has dark pixels.
    let row = 20usize * info.width as usize * 3;
    assert!(pixels[row..row + info.width as usize * 3].chunks(3).any(|p| p[0] < 0x80), "the title is drawn");
}

#[test]
fn wrong_plot_inputs_are_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let out = |p: &str| dir.path().join(p).display().to_string();
    let base = ["qwen2.5-0.5b", "--hardware", "t4"];
    let pdf = vramplan(&[&["plot", "breakdown"], &base[..], &["-o", &out("x.pdf")]].concat());
    assert_refused(&pdf, &["x.pdf", ".svg"]);
    let measured =
        vramplan(&[&["plot", "plan"], &base[..], &["--measured", "r.json", "-o", &out("x.svg")]].concat());
    assert_refused(&measured, &["--measured", "plot breakdown"]);
    let not_json = write(dir.path(), "bad.json", "{ nope");
    let bad = vramplan(
        &[&["plot", "breakdown"], &base[..], &["--measured", &not_json, "-o", &out("x.svg")]].concat(),
    );
    assert_refused(&bad, &["bad.json", "JSON"]);
    let no_run = write(dir.path(), "norun.json", r#"{"findings": [], "ok": false}"#);
    let no_run = vramplan(
        &[&["plot", "breakdown"], &base[..], &["--measured", &no_run, "-o", &out("x.svg")]].concat(),
    );
    assert_refused(&no_run, &["run.devices"]);
    let one_axis =
        vramplan(&[&["plot", "grid"], &base[..], &["--batch", "1..8", "-o", &out("x.svg")]].concat());
    assert_refused(&one_axis, &["two axes"]);
    let two_axes = vramplan(
        &[&["plot", "sweep"], &base[..], &["--batch", "1..8", "--seq", "512,1024", "-o", &out("x.svg")]]
            .concat(),
    );
    assert_refused(&two_axes, &["one axis"]);
    let no_folder =
        vramplan(&[&["plot", "breakdown"], &base[..], &["-o", "/nonexistent/dir/x.svg"]].concat());
    assert_refused(&no_folder, &["/nonexistent/dir/x.svg"]);
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("x."))
    );
}

#[test]
fn timeline_marks_each_gpus_peak_where_the_estimate_puts_it_and_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("t.svg").display().to_string();
    plot(&[&["timeline"], &PYTHIA[..]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let estimate = run_json(&[&["estimate"], &PYTHIA[..], &["--json"]].concat());
    // Each panel's byte axis: its right-aligned tick labels, rising from 0 upwards.
    let ticks: Vec<(f64, f64)> = elements(&svg, "text")
        .into_iter()
        .filter(|e| attribute(e, "text-anchor") == Some("end"))
        .filter_map(|e| Some((e[e.find('>')? + 1..].trim().parse::<f64>().ok()?, number(e, "y") as f64)))
        .collect();
    let panels: Vec<&[(f64, f64)]> = ticks.split(|t| t.0 == 0.0).skip(1).collect();
    let zeros: Vec<f64> = ticks.iter().filter(|t| t.0 == 0.0).map(|t| t.1).collect();
    let markers: Vec<(i64, i64)> = elements(&svg, "circle")
        .into_iter()
        .filter(|e| attribute(e, "r") == Some("5") && (90..870).contains(&number(e, "cx")))
        .map(|e| (number(e, "cx"), number(e, "cy")))
        .collect();
    let devices = estimate["devices"].as_array().unwrap();
    assert_eq!(markers.len(), devices.len(), "a peak marker per GPU");
    for (k, device) in devices.iter().enumerate() {
        let (zero, top) = (zeros[k], panels[k].last().unwrap());
        let per_gib = (zero - top.1) / top.0;
        let peak = device["peak_allocated_bytes"].as_u64().unwrap();
        let marker = markers.iter().find(|m| (m.1 as f64) <= zero && (m.1 as f64) >= top.1 - 30.0).unwrap();
        assert!(
            (marker.1 as f64 - (zero - peak as f64 / GIB * per_gib)).abs() <= 1.0,
            "GPU {k}: marker at {marker:?}"
        );
        let at = device["peak_at"].as_str().unwrap();
        let label = format!("peak (circled) {}: {at}", vramplan_profiles::units::format_bytes(peak));
        assert!(texts(&svg).iter().any(|t| t.2.ends_with(&label)), "GPU {k} labelled `{label}`");
    }
    for phase in ["load", "forward 1", "backward 1", "forward 2", "backward 2"] {
        assert!(says(&svg, phase), "{phase} is shaded and named");
    }
    // Llama-3.1-405B in 4-bit over eight H100s: some 10⁴ operations a GPU, drawn small.
    let big = dir.path().join("big.svg").display().to_string();
    plot(
        &["timeline", "llama-3.1-405b", "--hardware", "h100-80gb-x8", "--quant", "nf4", "--seq", "4096"],
        &big,
    );
    let size = std::fs::metadata(&big).unwrap().len();
    assert!(size < 1_000_000, "{size} bytes");
}

#[test]
fn a_report_is_the_same_markdown_each_time_and_one_offline_html_page() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = ["mixtral-8x7b", "--hardware", "t4x2", "--quant", "nf4", "--target", "accelerate-v4"];
    let md = dir.path().join("r.md").display().to_string();
    let out = vramplan(&[&["report"], &inputs[..], &["-o", &md]].concat());
    assert_eq!(out.code, 0, "{}", out.stderr);
    let first = std::fs::read(&md).unwrap();
    let text = String::from_utf8(first.clone()).unwrap();
    for file in ["r-plan.svg", "r-breakdown.svg", "r-timeline.svg"] {
        assert!(text.contains(&format!("]({file})")), "links {file}");
        assert!(dir.path().join(file).exists(), "writes {file} beside it");
    }
    // The plan's table is the one `plan` prints.
    let planned = vramplan(&[&["plan"], &inputs[..]].concat());
    let first_line = planned.stdout.lines().nth(2).unwrap();
    assert!(text.contains(first_line), "{first_line}");
    let out = vramplan(&[&["report"], &inputs[..], &["-o", &md]].concat());
    assert_eq!(out.code, 0);
    let again = std::fs::read(&md).unwrap();
    assert_eq!(first, again, "byte-identical Markdown (the solver's time is left out)");
    for file in ["r-plan.svg", "r-breakdown.svg", "r-timeline.svg"] {
        let drawn = std::fs::read(dir.path().join(file)).unwrap();
        let copy = dir.path().join(format!("copy-{file}"));
        std::fs::copy(dir.path().join(file), &copy).unwrap();
        assert_eq!(drawn, std::fs::read(copy).unwrap());
    }
    let html = dir.path().join("r.html").display().to_string();
    assert_eq!(vramplan(&[&["report"], &inputs[..], &["-o", &html]].concat()).code, 0);
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("<svg").count(), 3, "three drawings inline");
    assert!(
        !page.contains("<script") && !page.contains("src=") && !page.contains("href="),
        "nothing to fetch"
    );
    let bad = vramplan(
        &[&["report"], &inputs[..], &["-o", &dir.path().join("r.pdf").display().to_string()]].concat(),
    );
    assert_refused(&bad, &["r.pdf", ".md"]);
}

/// The polylines of `colour` drawn `width` pixels wide, as their points.
fn polylines(svg: &str, colour: u32, width: &str) -> Vec<Vec<(i64, i64)>> {
    elements(svg, "polyline")
        .into_iter()
        .filter(|e| {
            attribute(e, "stroke").map(hex) == Some(colour) && attribute(e, "stroke-width") == Some(width)
        })
        .filter_map(|e| {
            let points = attribute(e, "points")?
                .split_whitespace()
                .filter_map(|p| p.split_once(','))
                .map(|(x, y)| (x.parse().unwrap_or(0), y.parse().unwrap_or(0)))
                .collect();
            Some(points)
        })
        .collect()
}

#[test]
fn a_sweep_over_solved_maps_keeps_each_gpus_line_on_one_map() {
    // Full training of Qwen2.5-0.5B over a 4090 and a 3090: each batch that fits has its own
    // device map, the one past the boundary is replayed on the boundary's map, and no map fits
    // beyond (whatif estimates those on the layers split evenly, where GPU 0 holds less).
    let dir = tempfile::tempdir().unwrap();
    let base = ["qwen2.5-0.5b", "--hardware", "rtx4090+rtx3090", "--mode", "train", "--seq", "2048"];
    let svg_path = dir.path().join("s.svg").display().to_string();
    plot(&[&["sweep"], &base[..], &["--batch", "1..256"]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let answer = run_json(&[&["whatif", "max-batch"], &base[..], &["--json"]].concat());
    let (value, next) = (answer["value"].as_u64().unwrap(), answer["next"].as_u64().unwrap());
    assert!(next < 256, "the sweep runs past the boundary ({next})");
    // A GPU's line (2 px, its colour) never falls as the batch grows: it keeps to one map.
    for colour in [0x0072B2, 0xD55E00] {
        let drawn = polylines(&svg, colour, "2");
        assert!(drawn.iter().any(|l| l.len() >= 2), "GPU #{colour:06X} has a line");
        for line in drawn {
            for pair in line.windows(2) {
                assert!(pair[1].1 <= pair[0].1 + 1, "GPU #{colour:06X}'s line falls: {pair:?}");
            }
        }
    }
    // Solid points only at the values planned (those that fit, and the boundary's next on its
    // map); the values no map fits are drawn apart (hollow) and said so.
    let mut values: Vec<u64> = (0..9).map(|k| 1 << k).chain([value, next]).collect();
    values.sort_unstable();
    values.dedup();
    let mut solid: Vec<i64> = elements(&svg, "circle")
        .into_iter()
        .filter(|e| attribute(e, "r") == Some("3") && attribute(e, "fill") != Some("none"))
        .map(|e| number(e, "cx"))
        .collect();
    solid.sort_unstable();
    solid.dedup();
    assert_eq!(solid.len(), values.iter().filter(|&&v| v <= next).count(), "solid points at {solid:?}");
    assert!(says(&svg, "no device map fits: layers split evenly (△ above the axis)"));
}

#[test]
fn a_plans_bars_are_peak_reserved_against_its_limit_and_name_their_layers() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = ["llama-3.1-405b", "--hardware", "h100-80gb-x8", "--quant", "nf4"];
    let svg_path = dir.path().join("p.svg").display().to_string();
    plot(&[&["plan"], &inputs[..]].concat(), &svg_path);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let planned = run_json(&[&["plan"], &inputs[..], &["--json"]].concat());
    assert_eq!(planned["verdict"], "fits");
    let (per_gib, zero) = byte_axis(&svg);
    // Unit boxes (two shades) and the rest of the peak above them, per column.
    let bars: Vec<Rect> =
        rects(&svg).into_iter().filter(|r| [0x0072B2, 0x5AA8D8, 0xCC79A7].contains(&r.fill)).collect();
    let mut columns: Vec<i64> = bars.iter().map(|r| r.x).collect();
    columns.sort();
    columns.dedup();
    let devices = planned["devices"].as_array().unwrap();
    assert_eq!(columns.len(), devices.len());
    let dashes = polylines(&svg, 0x333333, "2");
    for (device, x) in devices.iter().zip(&columns) {
        let name = device["name"].as_str().unwrap();
        // The bar's top is the GPU's peak reserved, what the limit is on.
        let reserved = device["estimate"]["peak_reserved_bytes"].as_u64().unwrap() as f64 / GIB;
        let top = bars.iter().filter(|r| r.x == *x).map(|r| r.y).min().unwrap() as f64;
        assert!(
            (top - (zero - reserved * per_gib)).abs() <= 1.0,
            "{name}: top at {top} for {reserved:.2} GiB"
        );
        // The dashed limit over this column, and the bar under it (the plan fits).
        let limit = device["limit_bytes"].as_u64().unwrap() as f64 / GIB;
        let limit_y = zero - limit * per_gib;
        assert!(
            dashes.iter().any(|d| (d[0].1 as f64 - limit_y).abs() <= 1.0 && (d[0].0 - x).abs() < 200),
            "{name}: the limit is drawn at {limit_y:.0}"
        );
        assert!(top >= limit_y - 1.0, "{name}: within its limit, drawn within it");
        // Each run of consecutive layers is named (`layers 0–13`).
        let layers: Vec<u64> = device["units"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|u| u.as_str()?.strip_prefix("model.layers.")?.parse().ok())
            .collect();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for n in layers {
            match runs.last_mut() {
                Some(run) if run.1 + 1 == n => run.1 = n,
                _ => runs.push((n, n)),
            }
        }
        assert!(!runs.is_empty(), "{name} holds layers");
        for (a, b) in runs {
            let label = if a == b { format!("layers {a}") } else { format!("layers {a}–{b}") };
            assert!(says(&svg, &label), "{name}: `{label}` is written beside its layers");
        }
    }
}
