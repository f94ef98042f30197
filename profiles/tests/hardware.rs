//! Hardware profiles as the command line uses them: built-ins against published `nvidia-smi`
//! totals and datasheet figures, short forms, heterogeneous order, the multi-node cluster, YAML
//! round trips of every built-in, and bad files that must give located errors instead of panics.

use std::io::Write;
use vramplan_profiles::hardware::{self, HardwareProfile, LinkKind};
use vramplan_profiles::{InputError, Location};

const MIB: u64 = 1 << 20;

fn load(spec: &str) -> HardwareProfile {
    hardware::load(spec).unwrap_or_else(|e| panic!("{spec} should load: {e}"))
}

/// Writes `text` to a temporary `.yaml` file and loads it; the file lives as long as the result.
fn load_text(text: &str) -> (Result<HardwareProfile, InputError>, tempfile::NamedTempFile) {
    let mut file = tempfile::Builder::new().suffix(".yaml").tempfile().expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    let path = file.path().to_string_lossy().into_owned();
    (hardware::load(&path), file)
}

fn load_error(text: &str) -> InputError {
    match load_text(text).0 {
        Ok(profile) => panic!("expected an error, loaded {}", profile.name),
        Err(e) => e,
    }
}

fn at(line: u64, column: u64) -> Option<Location> {
    Some(Location::LineColumn { line, column })
}

/// PCIe per direction, per PCI-SIG: GT/s × lanes × 128/130 / 8 (generations 3 to 5).
fn pcie_x16(gt_per_s: f64) -> u64 {
    (gt_per_s * 1e9 * 16.0 * 128.0 / 130.0 / 8.0) as u64
}

#[test]
fn built_in_gpus_have_the_totals_nvidia_smi_reports() {
    // The issue's figures, then the ones researched for the catalog (sources in gpus.yaml).
    let expected_mib = [
        ("t4", 15_360),
        ("rtx4090", 24_564),
        ("a100-40gb", 40_960),
        ("a100-80gb", 81_920),
        ("h100-80gb", 81_559),
        ("h200", 143_771),
        ("rtx3090", 24_576),
        ("l4", 23_034),
        ("a10g", 23_028),
        ("v100-16gb", 16_384),
        ("v100-32gb", 32_768),
        ("l40s", 46_068),
    ];
    for (name, mib) in expected_mib {
        let profile = load(name);
        assert_eq!(profile.devices.len(), 1, "{name}");
        assert_eq!(profile.devices[0].memory_bytes, mib * MIB, "{name}");
        assert_eq!(profile.name, name);
    }
}

#[test]
fn compute_capability_and_number_formats_follow_the_generation() {
    // NVIDIA's compute-capability table; bf16 tensor cores from Ampere (8.0), fp8 from Ada (8.9).
    let cases = [
        ("v100-16gb", (7, 0), "Volta", false, false),
        ("t4", (7, 5), "Turing", false, false),
        ("a100-80gb", (8, 0), "Ampere", true, false),
        ("rtx3090", (8, 6), "Ampere", true, false),
        ("l4", (8, 9), "Ada", true, true),
        ("h100-80gb", (9, 0), "Hopper", true, true),
    ];
    for (name, (major, minor), generation, bf16, fp8) in cases {
        let device = &load(name).devices[0];
        assert_eq!(
            (device.compute_capability.major, device.compute_capability.minor),
            (major, minor),
            "{name}"
        );
        assert_eq!(device.generation, generation, "{name}");
        assert_eq!((device.bf16, device.fp8), (bf16, fp8), "{name}");
    }
}

#[test]
fn usable_memory_of_an_h100_matches_what_cuda_and_vllm_report() {
    // Independent figures: CUDA reports 85028896768 bytes on an H100 80GB (deviceQuery, driver
    // CUDA 12.8) and vLLM 0.19 finds 0.51 GiB in use after initialising CUDA.
    let device = &load("h100-80gb").devices[0];
    let measured = 85_028_896_768_f64 - 0.51 * (1u64 << 30) as f64;
    let usable = device.usable_bytes() as f64;
    assert!(usable <= measured + 0.005 * (1u64 << 30) as f64, "usable {usable} vs measured {measured}");
    assert!(usable >= measured - 2.0 * MIB as f64, "usable {usable} vs measured {measured}");
    assert_eq!(
        device.usable_bytes(),
        device.memory_bytes - device.driver_reserve_bytes - device.context_reserve_bytes
    );
    assert!(device.context_reserve_source.contains("vLLM"), "{}", device.context_reserve_source);
}

#[test]
fn context_reserves_default_per_generation_with_their_source() {
    let context = |name: &str| load(name).devices[0].context_reserve_bytes;
    assert_eq!(context("v100-32gb"), 1343 * MIB); // HF model-memory anatomy, V100, CUDA 11.2
    assert_eq!(context("t4"), 400_000_000); // ptrblck: 300-400 MB with lazy loading
    assert_eq!(context("a100-40gb"), 400_000_000);
    assert_eq!(context("rtx4090"), 426 * MIB); // unsloth-zoo PR #1053, RTX 6000 Ada
    assert_eq!(context("h200"), 522 * MIB); // vLLM 0.19 on H100: 0.51 GiB
    for name in hardware::builtin_names() {
        for device in load(name).devices {
            assert!(
                !device.context_reserve_source.is_empty() && !device.driver_reserve_source.is_empty(),
                "{name}"
            );
            assert!(device.usable_bytes() < device.memory_bytes, "{name}");
        }
    }
}

#[test]
fn the_four_node_cluster_has_32_gpus_and_a_slower_link_between_nodes() {
    let cluster = load("h100-80gb-x8-n4");
    assert_eq!(cluster.devices.len(), 32);
    assert_eq!(cluster.nodes.len(), 4);
    for (i, device) in cluster.devices.iter().enumerate() {
        assert_eq!(device.index as usize, i);
        assert_eq!(device.node as usize, i / 8);
        assert_eq!(device.memory_bytes, 81_559 * MIB);
    }
    // NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU = 450 GB/s each way.
    assert_eq!(cluster.link_bandwidth(0, 7), 450_000_000_000);
    assert_eq!(cluster.link_bandwidth(8, 15), 450_000_000_000);
    // One 400 Gb/s ConnectX-7 per GPU between nodes: 400e9 / 8 bytes per second.
    assert_eq!(cluster.link_bandwidth(0, 8), 400_000_000_000 / 8);
    assert_eq!(cluster.link_bandwidth(31, 0), 400_000_000_000 / 8);
    assert_eq!(cluster.inter_node_link.map(|l| l.kind), Some(LinkKind::Infiniband));
    // Same device: its HBM3 bandwidth (3.35 TB/s); no such device: 0.
    assert_eq!(cluster.link_bandwidth(5, 5), 3_350_000_000_000);
    assert_eq!(cluster.link_bandwidth(0, 32), 0);
    assert_eq!(cluster.nodes[0].host.ram_bytes, Some(2_000_000_000_000));
}

#[test]
fn nvlink_and_pcie_links_inside_a_node() {
    // HGX A100 4-GPU: 4 NVLink 3 links of 25 GB/s per direction between each pair.
    let a100 = load("a100-80gb-x4");
    assert_eq!(a100.link_bandwidth(0, 3), 4 * 25_000_000_000);
    // L40S and RTX 4090 have no NVLink: PCIe 4.0 x16 (16 GT/s).
    assert_eq!(load("l40s-x4").link_bandwidth(1, 2), pcie_x16(16.0));
    assert_eq!(load("rtx4090-x4").link_bandwidth(0, 1), pcie_x16(16.0));
    // T4s are PCIe 3.0 (8 GT/s).
    assert_eq!(load("t4x2").link_bandwidth(0, 1), pcie_x16(8.0));
    // DGX Station-style V100s: two NVLink 2 links (2 × 25 GB/s) per pair.
    assert_eq!(load("v100-32gb-x4").link_bandwidth(2, 3), 50_000_000_000);
}

#[test]
fn short_forms_make_n_copies_in_one_node() {
    let t4s = load("2xt4");
    assert_eq!(t4s.name, "2xt4");
    assert_eq!(t4s.devices.len(), 2);
    assert_eq!(t4s.nodes.len(), 1);
    assert!(t4s.devices.iter().all(|d| d.memory_bytes == 15_360 * MIB && d.node == 0));
    assert_eq!(t4s.nodes[0].gpu_link, None);
    assert_eq!(t4s.link_bandwidth(0, 1), pcie_x16(8.0));

    let a100s = load("4xa100-80gb");
    assert_eq!(a100s.devices.len(), 4);
    assert!(a100s.devices.iter().all(|d| d.memory_bytes == 81_920 * MIB));
    assert_eq!(a100s.nodes[0].gpu_link.map(|l| l.kind), Some(LinkKind::Nvlink));
    assert_eq!(a100s.link_bandwidth(1, 2), 100_000_000_000);

    // Spelling variants give the same devices.
    for variant in ["2XT4", "2×t4", " 2x t4 "] {
        assert_eq!(load(variant).devices, t4s.devices, "{variant}");
    }
    // The built-in and the short form agree on the devices and the link.
    assert_eq!(load("4xa100-80gb").devices, load("a100-80gb-x4").devices);
    assert_eq!(load("4xa100-80gb").nodes[0].gpu_link, load("a100-80gb-x4").nodes[0].gpu_link);
}

#[test]
fn heterogeneous_profiles_keep_the_order_written() {
    let builtin = load("rtx4090+rtx3090");
    let names: Vec<&str> = builtin.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"]);
    assert_eq!(builtin.devices[0].memory_bytes, 24_564 * MIB);
    assert_eq!(builtin.devices[1].memory_bytes, 24_576 * MIB);

    let reversed = load("rtx3090+rtx4090");
    assert_eq!(reversed.devices[0].memory_bytes, 24_576 * MIB);
    assert_eq!(reversed.devices[1].memory_bytes, 24_564 * MIB);
    assert_eq!(reversed.devices[1].index, 1);

    let mixed = load("2xt4+rtx4090");
    let memory: Vec<u64> = mixed.devices.iter().map(|d| d.memory_bytes / MIB).collect();
    assert_eq!(memory, [15_360, 15_360, 24_564]);
    // T4 (PCIe 3.0) to 4090 (PCIe 4.0) runs at the slower link; the two T4s likewise.
    assert_eq!(mixed.link_bandwidth(0, 2), pcie_x16(8.0));
    assert_eq!(mixed.link_bandwidth(0, 1), pcie_x16(8.0));
}

#[test]
fn every_built_in_survives_a_yaml_round_trip() {
    let mut names = hardware::builtin_names();
    names.extend(["2xt4+rtx4090", "4xa100-80gb", "3xl4"]);
    for name in names {
        let original = load(name);
        let text = hardware::to_yaml(&original);
        let (reloaded, _file) = load_text(&text);
        let reloaded =
            reloaded.unwrap_or_else(|e| panic!("{name}: the written YAML does not load: {e}\n{text}"));
        assert_eq!(reloaded, original, "{name}:\n{text}");
    }
}

#[test]
fn the_built_in_list_is_complete_and_every_entry_loads_under_its_name() {
    let names = hardware::builtin_names();
    let required = [
        "t4",
        "t4x2",
        "rtx4090",
        "rtx3090",
        "l4",
        "a10g",
        "v100-16gb",
        "v100-32gb",
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200",
        "v100-32gb-x4",
        "a100-40gb-x4",
        "a100-80gb-x4",
        "l40s-x4",
        "rtx4090-x4",
        "h100-80gb-x8",
        "h100-80gb-x8-n2",
        "h100-80gb-x8-n4",
        "rtx4090+rtx3090",
    ];
    for name in required {
        assert!(names.contains(&name), "{name} is missing");
    }
    let expected_devices = [("t4x2", 2), ("v100-32gb-x4", 4), ("l40s-x4", 4), ("h100-80gb-x8", 8)];
    for (name, count) in expected_devices {
        assert_eq!(load(name).devices.len(), count, "{name}");
    }
    for name in names {
        let profile = load(name);
        assert_eq!(profile.name, name);
        assert!(!profile.description.is_empty(), "{name}");
    }
}

#[test]
fn a_yaml_syntax_error_is_located() {
    let err = load_error("name: x\ndevices:\n  - gpu: t4\n   count: 2\n");
    assert_eq!(err.location, at(4, 4), "{err}");
    assert!(err.origin.ends_with(".yaml"), "{err}");
}

#[test]
fn a_size_without_unit_is_refused_with_the_fix() {
    let err = load_error("name: x\ndevices:\n  - gpu: t4\n    memory: 16\n");
    assert_eq!(err.location, at(4, 13), "{err}");
    assert!(err.problem.contains("devices[0].memory") && err.problem.contains("no unit"), "{err}");
    assert!(err.fix.as_deref().is_some_and(|f| f.contains("MiB")), "{err}");
}

#[test]
fn negative_and_unknown_unit_sizes_are_refused() {
    let err = load_error("name: x\ndevices:\n  - gpu: t4\n  - gpu: l4\n    memory: -16GiB\n");
    assert_eq!(err.location, at(5, 13), "{err}");
    assert!(err.problem.contains("devices[1].memory") && err.problem.contains("negative"), "{err}");

    let err = load_error("name: x\ndevices:\n  - gpu: t4\n    memory: 16 gigs\n");
    assert_eq!(err.location, at(4, 13), "{err}");
    assert!(err.problem.contains("unknown unit"), "{err}");

    let err = load_error("name: x\ndevices:\n  - gpu: t4\nhost:\n  ram: 64\n");
    assert_eq!(err.location, at(5, 8), "{err}");
    assert!(err.problem.contains("host.ram"), "{err}");
}

#[test]
fn zero_devices_are_refused_where_the_list_is() {
    let err = load_error("name: x\ndevices: []\n");
    assert_eq!(err.location.as_ref().map(line_of), Some(2), "{err}");
    assert!(err.problem.contains("empty"), "{err}");

    let err = load_error("name: x\n");
    assert!(err.problem.contains("no devices"), "{err}");
    assert!(err.fix.is_some(), "{err}");

    let err = load_error("name: x\ndevices:\n  - gpu: t4\n    count: 0\n");
    assert_eq!(err.location, at(4, 12), "{err}");
}

fn line_of(location: &Location) -> u64 {
    match location {
        Location::LineColumn { line, .. } => *line,
        Location::Key(_) => 0,
    }
}

#[test]
fn an_unknown_gpu_reference_names_the_catalog() {
    let err = load_error("name: x\ndevices:\n  - gpu: t4\n  - gpu: rtx5090\n");
    assert_eq!(err.location, at(4, 10), "{err}");
    assert!(err.problem.contains("devices[1].gpu") && err.problem.contains("rtx5090"), "{err}");
    let fix = err.fix.unwrap_or_default();
    assert!(fix.contains("rtx4090") && fix.contains("a100-80gb"), "{fix}");
}

#[test]
fn an_unknown_key_is_located() {
    let err = load_error("name: x\ndevices:\n  - gpu: t4\n    memroy: 16GiB\n");
    assert_eq!(err.location, at(4, 5), "{err}");
    assert!(err.problem.contains("memroy"), "{err}");
}

#[test]
fn several_nodes_need_an_inter_node_link() {
    let err = load_error("name: x\nnodes:\n  - count: 2\n    devices:\n      - gpu: a100-80gb\n");
    assert!(err.problem.contains("inter_node_link"), "{err}");
    assert_eq!(err.location.as_ref().map(line_of), Some(3), "{err}");
}

#[test]
fn an_inline_gpu_takes_the_defaults_of_its_generation() {
    let text = "name: my-box\ndevices:\n  - name: NVIDIA RTX A6000\n    memory: 49140MiB\n    compute_capability: \"8.6\"\n    memory_bandwidth: 768GB/s\n    pcie: {generation: 4}\n    count: 2\n";
    let (profile, _file) = load_text(text);
    let profile = profile.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(profile.name, "my-box");
    assert_eq!(profile.devices.len(), 2);
    let device = &profile.devices[1];
    assert_eq!(device.model, None);
    assert_eq!(device.generation, "Ampere");
    assert_eq!(device.context_reserve_bytes, 400_000_000);
    assert!(device.bf16 && !device.fp8);
    assert_eq!(device.pcie.lanes, 16);

    // Outside the generation table the reserves must be given.
    let err = load_error(&text.replace("\"8.6\"", "\"12.0\""));
    assert_eq!(err.location.as_ref().map(line_of), Some(3), "{err}");
    assert!(err.problem.contains("12.0") && err.fix.is_some(), "{err}");
}

#[test]
fn a_catalog_gpu_can_be_overridden_key_by_key() {
    let text = "devices:\n  - gpu: a100-80gb\n    context_reserve: 1GiB\n  - gpu: a100-80gb\n";
    let (profile, file) = load_text(text);
    let profile = profile.unwrap_or_else(|e| panic!("{e}"));
    let stem = file.path().file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    assert_eq!(profile.name, stem);
    assert_eq!(profile.devices[0].context_reserve_bytes, 1 << 30);
    assert!(profile.devices[0].context_reserve_source.starts_with("set in "));
    assert_eq!(profile.devices[1].context_reserve_bytes, 400_000_000);
    assert_eq!(profile.devices[0].memory_bytes, 81_920 * MIB);
    // Two A100s of the same model: the default NVLink, all 12 links to the one peer.
    assert_eq!(profile.link_bandwidth(0, 1), 300_000_000_000);
}

#[test]
fn reserves_larger_than_the_memory_are_refused() {
    let err = load_error("devices:\n  - gpu: t4\n    driver_reserve: 15GiB\n");
    assert_eq!(err.location.as_ref().map(line_of), Some(2), "{err}");
    assert!(err.problem.contains("leave nothing"), "{err}");
}

#[test]
fn unknown_names_list_the_built_ins_and_suggest_close_ones() {
    let err = hardware::load("rtx409").unwrap_err();
    let fix = err.fix.unwrap_or_default();
    assert!(fix.contains("did you mean `rtx4090`"), "{fix}");
    assert!(fix.contains("h100-80gb-x8-n4"), "{fix}");

    let err = hardware::load("rtx4090x2").unwrap_err();
    assert!(err.fix.unwrap_or_default().contains("2xrtx4090"));

    let err = hardware::load("2xfoo").unwrap_err();
    assert!(err.problem.contains("foo"), "{err}");

    let err = hardware::load("missing-profile.yaml").unwrap_err();
    assert!(err.problem.contains("no such file"), "{err}");
}

#[test]
fn odd_inputs_give_errors_not_panics() {
    let specs = [
        "",
        "+",
        "x",
        "0xt4",
        "99999999999xt4",
        "2x",
        "t4++t4",
        "2xt4+",
        "1025xt4",
        "\u{0}",
        "a100-80gb-x4+t4",
    ];
    for spec in specs {
        assert!(hardware::load(spec).is_err(), "`{spec}` should be refused");
    }
    let texts = [
        "",
        "[]",
        "name: [1, 2]",
        "devices: 3",
        "devices:\n  - 3\n",
        "devices:\n  - gpu: t4\n    count: 5000\n",
        "devices:\n  - gpu: t4\n    pcie: {generation: 9}\n",
        "devices:\n  - gpu: t4\n    compute_capability: eight\n",
        "devices:\n  - gpu: t4\n    memory_bandwidth: 300GB\n",
        "nodes: []\n",
        "nodes:\n  - count: 1000\n    devices:\n      - gpu: t4\n        count: 1000\ninter_node_link: {kind: ethernet, bandwidth: 1GB/s}\n",
        "devices:\n  - gpu: t4\ngpu_link: {kind: warp, bandwidth: 1GB/s}\n",
        "devices:\n  - gpu: t4\ninter_node_link: {kind: infiniband, bandwidth: 0GB/s}\n",
    ];
    for text in texts {
        let err = load_error(text);
        assert!(!err.problem.is_empty(), "{text}");
    }
}

/// The built-ins table of docs/hardware-profiles.md, generated from the profiles themselves.
fn builtins_table() -> String {
    let mut text = String::from(
        "| name | devices | memory each (nvidia-smi) | usable each | GPU link | host |\n|---|---|---|---|---|---|\n",
    );
    for name in hardware::builtin_names() {
        let profile = load(name);
        let mut kinds: Vec<(String, u64, u64, usize)> = Vec::new();
        for d in &profile.devices {
            match kinds.iter_mut().find(|(n, m, _, _)| *n == d.name && *m == d.memory_bytes) {
                Some(kind) => kind.3 += 1,
                None => kinds.push((d.name.clone(), d.memory_bytes, d.usable_bytes(), 1)),
            }
        }
        let devices = kinds.iter().map(|(n, _, _, c)| format!("{c}× {n}")).collect::<Vec<_>>().join(" + ");
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / MIB as f64);
        let memory = kinds.iter().map(|k| mib(k.1)).collect::<Vec<_>>().join(" / ");
        let usable = kinds.iter().map(|k| mib(k.2)).collect::<Vec<_>>().join(" / ");
        let gb = |b: u64| format!("{} GB/s", (b as f64 / 1e9 * 100.0).round() / 100.0);
        let mut link = match (profile.devices.len(), profile.nodes[0].gpu_link) {
            (1, _) => "—".to_string(),
            (_, Some(l)) => {
                format!("NVLink {}, {} per pair", l.generation.unwrap_or(0), gb(l.bandwidth_bytes_per_s))
            }
            (_, None) => format!("PCIe, {} per pair", gb(profile.link_bandwidth(0, 1))),
        };
        if let Some(l) = profile.inter_node_link {
            let kind = match l.kind {
                LinkKind::Infiniband => "InfiniBand",
                LinkKind::Ethernet => "Ethernet",
                LinkKind::Nvlink => "NVLink",
                LinkKind::Pcie => "PCIe",
            };
            let nodes = profile.nodes.len();
            link += &format!("; {nodes} nodes, {kind} {} between them", gb(l.bandwidth_bytes_per_s));
        }
        let size = |b: u64| match b {
            b if b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
            b if b >= 1_000_000_000_000 => format!("{} TB", b as f64 / 1e12),
            b => format!("{} GB", b as f64 / 1e9),
        };
        let host = profile.nodes[0].host;
        let mut host_text = Vec::new();
        if let Some(ram) = host.ram_bytes {
            host_text.push(format!("RAM {}", size(ram)));
        }
        if let Some(disk) = host.disk_bytes {
            host_text.push(format!("disk {}", size(disk)));
        }
        let host_text = if host_text.is_empty() { "—".to_string() } else { host_text.join(", ") };
        text += &format!("| `{name}` | {devices} | {memory} | {usable} | {link} | {host_text} |\n");
    }
    text
}

/// The GPU table of docs/hardware-profiles.md: one row per single-GPU built-in (one per catalog GPU).
fn gpus_table() -> String {
    let mut text = String::from(
        "| key | nvidia-smi name | memory | driver reserve | context reserve | CC | bf16 | fp8 | memory bandwidth | PCIe | NVLink (per direction) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for name in hardware::builtin_names() {
        let profile = load(name);
        let [device] = profile.devices.as_slice() else { continue };
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / MIB as f64);
        let yes = |flag: bool| if flag { "yes" } else { "no" };
        let nvlink = device.nvlink.map_or("—".to_string(), |n| {
            format!("NVLink {}, {} GB/s", n.generation, n.bandwidth_bytes_per_s / 1_000_000_000)
        });
        text += &format!(
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} GB/s | {}.0 x{} | {} |\n",
            device.model.as_deref().unwrap_or("—"),
            device.name,
            mib(device.memory_bytes),
            mib(device.driver_reserve_bytes),
            mib(device.context_reserve_bytes),
            device.compute_capability,
            yes(device.bf16),
            yes(device.fp8),
            device.bandwidth_bytes_per_s / 1_000_000_000,
            device.pcie.generation,
            device.pcie.lanes,
            nvlink
        );
    }
    text
}

#[test]
fn the_doc_lists_every_built_in_with_its_figures() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/hardware-profiles.md");
    let doc = std::fs::read_to_string(&path).expect("docs/hardware-profiles.md exists");
    for table in [builtins_table(), gpus_table()] {
        assert!(
            doc.contains(&table),
            "a table in docs/hardware-profiles.md is stale; regenerate it with\n\
             `cargo test -p vramplan-profiles --test hardware -- --ignored print_builtins_table --nocapture`:\n{table}"
        );
    }
}

#[test]
#[ignore = "prints the built-ins table for docs/hardware-profiles.md"]
fn print_builtins_table() {
    println!("{}\n{}", builtins_table(), gpus_table());
}

#[test]
fn the_doc_examples_load() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/hardware-profiles.md");
    let doc = std::fs::read_to_string(&path).expect("docs/hardware-profiles.md exists");
    let examples: Vec<&str> = doc.split("```yaml\n").skip(1).filter_map(|s| s.split("```").next()).collect();
    assert_eq!(examples.len(), 2);
    let (single, _file) = load_text(examples[0]);
    let single = single.unwrap_or_else(|e| panic!("the single-node example: {e}"));
    let names: Vec<&str> = single.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", "NVIDIA RTX A6000", "NVIDIA RTX A6000"]
    );
    assert_eq!(single.devices[1].context_reserve_bytes, 600 * MIB);
    assert_eq!(single.link_bandwidth(0, 3), 25_000_000_000);
    assert_eq!(single.nodes[0].host.ram_bytes, Some(128 << 30));
    let (cluster, _file) = load_text(examples[1]);
    let cluster = cluster.unwrap_or_else(|e| panic!("the multi-node example: {e}"));
    let builtin = load("h100-80gb-x8-n4");
    assert!(
        cluster.devices == builtin.devices && cluster.nodes == builtin.nodes,
        "the example differs from the built-in"
    );
    assert_eq!(cluster.inter_node_link, builtin.inter_node_link);
}
