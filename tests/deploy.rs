//! The cluster deployments in `deploy/`: the Kubernetes manifest validates against the
//! Kubernetes schemas (offline, with the `kubernetes-validate` Python package: those tests are
//! ignored by default, and `.ci/run` installs the package and runs them), and the shell the Slurm script and
//! the Kubernetes Jobs run, run here task by task as the scheduler would, merges into exactly the
//! unsharded sweep. `scripts/slurm-check.sh` runs the Slurm side on a real one-node cluster.

use crate::util::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The Kubernetes version the manifest is checked against (and documented for).
const KUBERNETES_VERSION: &str = "1.30.0";
const MANIFEST: &str = "deploy/k8s/sweep-job.yaml";
/// A small grid: the reference plus four configs, in three shards.
const SPECS: &str = "pytorch:max_split_size_mb:{64,128},roundup_power2_divisions:{1,4}";
const SHARDS: usize = 3;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Why the tests that run Python tooling are ignored by default.
const NEEDS_PYTHON: &str =
    "needs the kubernetes-validate Python package (with PyYAML); .ci/run installs it and runs these";

/// Asserts that `python3` can import `module`: the ignored tests fail without it.
fn require_python_module(module: &str) {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "python3 cannot import {module}: this test {NEEDS_PYTHON} (python3 -m pip install kubernetes-validate)");
}

fn validate(manifest: &Path) -> Output {
    Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "-k", KUBERNETES_VERSION])
        .arg(manifest)
        .output()
        .expect("python3 runs")
}

#[test]
#[ignore = "needs the kubernetes-validate Python package; .ci/run installs it and runs it"]
fn the_k8s_manifest_validates_against_the_kubernetes_schemas() {
    require_python_module("kubernetes_validate");
    let out = validate(&repo(MANIFEST));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(out.status.success(), "{MANIFEST} does not validate:\n{text}");
    for resource in [
        "configmap/fragsim-sweep",
        "persistentvolumeclaim/fragsim-sweep-data",
        "job/fragsim-sweep",
        "job/fragsim-merge",
    ] {
        assert!(text.contains(&format!("passed for resource {resource}")), "{resource}:\n{text}");
    }
    // The validator does reject what Kubernetes would: a misspelt field fails.
    let manifest = std::fs::read_to_string(repo(MANIFEST)).unwrap();
    assert!(manifest.contains("  parallelism: 4\n"));
    let broken = manifest.replace("  parallelism: 4\n", "  paralelism: 4\n");
    let (_dir, path) = temp_file("broken.yaml", broken.as_bytes());
    let out = validate(&path);
    assert!(!out.status.success(), "a misspelt field passed:\n{}", stdout(&out));
}

/// The traces swept: two real snapshots, by absolute path.
fn traces() -> Vec<String> {
    ["cs336-lm-step-c.pickle", "cs336-medium-ctx512-infer.pickle"]
        .map(|t| real_trace(t).to_string_lossy().into_owned())
        .to_vec()
}

/// Checks that `out` holds `sweep.json` and `sweep.txt` equal to the unsharded sweep's.
fn assert_merged_equals_unsharded(out: &Path) {
    let traces = traces();
    let mut args: Vec<&str> = vec!["sweep"];
    args.extend(traces.iter().map(String::as_str));
    args.extend(["-p", SPECS]);
    let table = run(&args);
    assert!(table.status.success(), "{}", stderr(&table));
    args.push("--json");
    let whole: Value = serde_json::from_str(&stdout(&run(&args))).unwrap();
    let merged = std::fs::read_to_string(out.join("sweep.json")).unwrap();
    let merged: Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(untimed(merged), untimed(whole));
    assert_eq!(std::fs::read_to_string(out.join("sweep.txt")).unwrap(), stdout(&table));
}

/// Runs `program args` with the sweep's settings in the environment plus `env`.
fn run_step(program: &str, args: &[&str], out: &Path, env: &[(&str, String)]) {
    let result = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("FRAGSIM", env!("CARGO_BIN_EXE_fragsim"))
        .env("FRAGSIM_TRACES", traces().join(" "))
        .env("FRAGSIM_SPECS", SPECS)
        .env("FRAGSIM_ARGS", "")
        .env("FRAGSIM_SHARDS", SHARDS.to_string())
        .env("FRAGSIM_OUT", out)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(result.status.success(), "{program} {args:?} {env:?}:\n{}", stderr(&result));
}

#[test]
fn the_slurm_array_tasks_and_merge_job_equal_the_unsharded_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let script = repo("deploy/slurm/sweep.sbatch").to_string_lossy().into_owned();
    // An array submitted as --array=5-7: the task ids need not start at 0.
    for id in [7, 5, 6] {
        let env = [
            ("SLURM_ARRAY_TASK_ID", id.to_string()),
            ("SLURM_ARRAY_TASK_MIN", "5".to_string()),
            ("SLURM_ARRAY_TASK_COUNT", SHARDS.to_string()),
        ];
        run_step("bash", &[&script], dir.path(), &env);
    }
    for i in 1..=SHARDS {
        assert!(dir.path().join(format!("part-{i}-of-{SHARDS}.json")).is_file(), "part {i}");
    }
    run_step("bash", &[&script], dir.path(), &[("FRAGSIM_STEP", "merge".to_string())]);
    assert_merged_equals_unsharded(dir.path());
}

#[test]
#[ignore = "needs PyYAML (kubernetes-validate's dependency); .ci/run installs it and runs it"]
fn the_k8s_jobs_shell_equals_the_unsharded_sweep() {
    require_python_module("yaml");
    // The scripts of the shard container, the merge Job's init container and its container.
    let extract = "import json, sys, yaml\n\
        docs = {d['metadata']['name']: d for d in yaml.safe_load_all(open(sys.argv[1])) if d['kind'] == 'Job'}\n\
        pod = lambda job: docs[job]['spec']['template']['spec']\n\
        print(json.dumps([pod('fragsim-sweep')['containers'][0]['command'][2],\n\
            pod('fragsim-merge')['initContainers'][0]['command'][2],\n\
            pod('fragsim-merge')['containers'][0]['command'][2]]))";
    let out = Command::new("python3").args(["-c", extract]).arg(repo(MANIFEST)).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let scripts: Vec<String> = serde_json::from_str(&stdout(&out)).unwrap();
    let manifest = std::fs::read_to_string(repo(MANIFEST)).unwrap();
    assert!(manifest.contains("completionMode: Indexed"));
    assert!(scripts[0].contains("JOB_COMPLETION_INDEX"));

    let dir = tempfile::tempdir().unwrap();
    for index in [2, 0, 1] {
        let env = [("JOB_COMPLETION_INDEX", index.to_string())];
        run_step("sh", &["-c", &scripts[0]], dir.path(), &env);
    }
    // Every part is there, so the wait ends at once; then the merge.
    run_step("sh", &["-c", &scripts[1]], dir.path(), &[]);
    run_step("sh", &["-c", &scripts[2]], dir.path(), &[]);
    assert_merged_equals_unsharded(dir.path());
}
