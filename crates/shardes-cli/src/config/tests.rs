//! Unit tests of the config parser.
use super::*;

const QUICK: &str = r#"
devices = 8
[problem]
name = "transformer_block"
d_model = 64
batch = 8
seq = 32
[es]
strategy = "mirrored(lowrank(r=1))"
n = 256
sigma = 0.01
lr = 0.01
shaping = "centered_ranks"
how = "B"
[run]
seed = 0
generations = 30
out = "runs/quickstart"
checkpoint_every = 10
"#;

#[test]
fn every_listed_es_and_run_key_deserializes() {
    let text = QUICK.replace(
        "how = \"B\"",
        "how = \"B\"\nmember_chunk = 8\nkeep_noise_mib = 4\noptimizer = { name = \"adam\", b1 = 0.8 }\n\
         freeze = [\"w*\"]\nsigma_separable = \"sigma.safetensors\"\nhow_hosts = \"B\"\n\
         sigma_leaves = { \"b*\" = 0.02 }\ncompute_dtype = \"bf16\"\ndevice_invariant = true",
    );
    let text = text.replace(
        "checkpoint_every = 10",
        "checkpoint_every = 10\ntensorboard = true",
    );
    let c = Config::parse(&text).expect("every [es] key set");
    assert_eq!(c.es.member_chunk, Some(8));
    assert!(c.es.device_invariant);
    assert_eq!(c.es.keep_noise_bytes(), 4 << 20);
    assert_eq!(
        (c.es.optimizer.name, c.es.optimizer.b1),
        (OptimizerName::Adam, Some(0.8))
    );
    let table: toml::Table = toml::from_str(&text).expect("toml");
    for (name, keys) in [
        ("es", keys::fields::<EsConfig>()),
        ("run", keys::fields::<RunConfig>()),
    ] {
        let set = table[name].as_table().expect("table");
        for k in keys {
            assert!(
                set.contains_key(*k),
                "{name}.{k} is listed but not exercised here"
            );
        }
        assert_eq!(set.len(), keys.len(), "[{name}] sets a key the list lacks");
    }
    // Unset, the library's default budget.
    let plain = Config::parse(QUICK).expect("quickstart");
    assert_eq!(
        plain.es.keep_noise_bytes(),
        shardes::hlo::es::KEEP_NOISE_BYTES
    );
}

/// Each problem's keys ([`problem_reads`]) are exactly the keys its variant reads and
/// writes: set them all, parse, serialize back.
#[test]
fn problem_keys_match_the_variants() {
    let values = [
        ("d_model", "8"),
        ("batch", "2"),
        ("seq", "4"),
        ("checkpoint", "\"a\""),
        ("size", "\"tiny\""),
        ("data", "\"d.jsonl\""),
        ("tokenizer", "\"t.json\""),
        ("compute_dtype", "\"bf16\""),
        ("layers", "\"loop\""),
        ("model", "\"smollm2-135m-instruct\""),
        ("env", "\"pendulum\""),
        ("episodes", "3"),
        ("episode_length", "50"),
        ("hidden", "[8, 4]"),
        ("rows", "4"),
        ("cols", "3"),
        ("condition", "10.0"),
        ("mjcf", "\"m.xml\""),
    ];
    for name in problems() {
        let keys = problem_reads(name);
        let mut body = format!("name = \"{name}\"\n");
        for k in keys {
            let (_, v) = values.iter().find(|(n, _)| n == k).expect("a test value");
            body.push_str(&format!("{k} = {v}\n"));
        }
        let table: toml::Table = toml::from_str(&body).expect("toml");
        let p: ProblemConfig = table.clone().try_into().expect("every key deserializes");
        assert_eq!(p.name(), *name);
        let back = toml::Table::try_from(&p).expect("serializes");
        assert_eq!(back, table, "{name}: listed keys and variant fields differ");
        // The trajectory hash hashes this text, so the order is part of the format.
        let text = serde_json::to_string(&p).expect("json");
        let at: Vec<usize> = keys
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).expect("serialized"))
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{name}: listed order is not the field order: {text}"
        );
    }
    assert_eq!(
        problem_keys(),
        [
            "name",
            "d_model",
            "batch",
            "seq",
            "checkpoint",
            "size",
            "data",
            "tokenizer",
            "compute_dtype",
            "layers",
            "model",
            "env",
            "episodes",
            "episode_length",
            "hidden",
            "mjcf",
            "rows",
            "cols",
            "condition"
        ]
    );
}

/// The names and keys read from the definitions are the lists earlier builds wrote out by
/// hand (a task or problem added later only adds to them), and every section probed has
/// its keys.
#[test]
fn the_lists_read_from_the_definitions_are_the_ones_written_before() {
    assert!(problems().starts_with(&["transformer_block", "qwen2", "control", "quadratic"]));
    assert!(task_names().starts_with(&["countdown", "jsonl", "target_token"]));
    let common = [
        "name",
        "prompts",
        "prompt_len",
        "max_new_tokens",
        "chat",
        "system",
        "response_prefix",
        "temperature",
        "top_p",
        "eos",
    ];
    for (task, own) in [
        (
            "countdown",
            &[
                "min_numbers",
                "max_numbers",
                "min_number",
                "max_number",
                "max_target",
                "eval_seed",
                "style",
            ][..],
        ),
        ("jsonl", &["train", "held_out"]),
        ("target_token", &["token", "prompt_tokens"]),
    ] {
        let want: Vec<&str> = common.iter().chain(own).copied().collect();
        assert_eq!(task_keys(task), want, "{task}");
    }
    assert!(task_keys("nothing").is_empty());
    assert_eq!(
        keys::fields::<Config>(),
        ["plugin", "devices", "problem", "es", "run", "task", "eval"]
    );
    assert_eq!(
        keys::fields::<EvalConfig>(),
        ["every", "prompts", "samples"]
    );
    assert_eq!(
        keys::fields::<task::RewardConfig>(),
        ["command", "timeout_s", "restarts"]
    );
    assert_eq!(
        keys::fields::<RunConfig>(),
        [
            "seed",
            "generations",
            "out",
            "checkpoint_every",
            "tensorboard"
        ]
    );
    assert_eq!(keys::fields::<EsConfig>().len(), 15);
    for name in task_names() {
        let task = keys::named::<TaskConfig>(name).expect("a task parses from its name");
        assert_eq!(task.name(), *name);
    }
}

/// A resume compares this hash with the one in `state.json`: it must not change for the
/// same config (these values are what earlier builds wrote).
#[test]
fn trajectory_hash_is_stable() {
    let base = "devices = 2\n[es]\nn = 32\nsigma = 0.01\nlr = 0.01\n[run]\ngenerations = 3\n";
    for (problem, hash) in [
        (
            "name = \"qwen2\"\ncheckpoint = \"a/b\"\ndata = \"d.jsonl\"\ntokenizer = \"t.json\"\n\
             compute_dtype = \"bf16\"\nbatch = 4\nseq = 9\n",
            "26ac39979e28a929",
        ),
        (
            "name = \"qwen2\"\nsize = \"tiny\"\ndata = \"d.jsonl\"\n",
            "b5141723d1db8bc5",
        ),
        ("name = \"transformer_block\"\n", "8ee40aca2dbd6c9e"),
        (
            "name = \"transformer_block\"\nseq = 4\nd_model = 8\n",
            "6730fa28471b4867",
        ),
    ] {
        let c = Config::parse(&format!("{base}[problem]\n{problem}")).expect("parses");
        assert_eq!(c.trajectory_hash(), hash, "{problem}");
    }
    let quick = Config::parse(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/quickstart.toml"
        ))
        .expect("the quickstart config"),
    )
    .expect("parses");
    assert_eq!(quick.trajectory_hash(), "583348bec77908e0");
}

#[test]
fn quickstart_parses() {
    let c = Config::parse(QUICK).unwrap();
    assert_eq!(c.es.n, 256);
    assert_eq!(c.es.strategy.pairing(), 2);
}

fn err(text: &str) -> String {
    Config::parse(text).unwrap_err().to_string()
}

#[test]
fn unknown_key_names_the_nearest() {
    let e = err(&QUICK.replace("sigma = 0.01", "sigmaa = 0.01"));
    assert!(e.contains("unknown key `es.sigmaa`"), "{e}");
    assert!(e.contains("did you mean `sigma`"), "{e}");
}

#[test]
fn wrong_type_is_reported() {
    let e = err(&QUICK.replace("n = 256", "n = \"many\""));
    assert!(e.contains("wrong value"), "{e}");
    assert!(e.contains("(`n = \"many\"`)"), "{e}");
}

#[test]
fn indivisible_population_names_the_numbers() {
    let e = err(&QUICK.replace("n = 256", "n = 100"));
    assert!(e.contains("es.n = 100"), "{e}");
    assert!(e.contains("multiple of 16"), "{e}");
}

#[test]
fn unknown_strategy_and_shaping() {
    let e = err(&QUICK.replace("mirrored(lowrank(r=1))", "lowrnk"));
    assert!(e.contains("unknown strategy"), "{e}");
    let e = err(&QUICK.replace("\"centered_ranks\"", "\"centred_ranks\""));
    assert!(e.contains("did you mean \"centered_ranks\""), "{e}");
}

#[test]
fn bad_sigma_and_how() {
    assert!(err(&QUICK.replace("sigma = 0.01", "sigma = -1.0")).contains("es.sigma"));
    assert!(err(&QUICK.replace("how = \"B\"", "how = \"C\"")).contains("es.how"));
}

#[test]
fn hash_ignores_run_length_but_not_sigma() {
    let a = Config::parse(QUICK).unwrap();
    let b = Config::parse(&QUICK.replace("generations = 30", "generations = 5")).unwrap();
    let c = Config::parse(&QUICK.replace("sigma = 0.01", "sigma = 0.02")).unwrap();
    assert_eq!(a.trajectory_hash(), b.trajectory_hash());
    assert_ne!(a.trajectory_hash(), c.trajectory_hash());
}

#[test]
fn sgd_written_out_hashes_as_a_config_without_an_optimizer() {
    let plain = Config::parse(QUICK).expect("quickstart");
    for written in ["optimizer = \"sgd\"", "optimizer = { name = \"sgd\" }"] {
        let text = QUICK.replace("how = \"B\"", &format!("how = \"B\"\n{written}"));
        let c = Config::parse(&text).expect(written);
        assert_eq!(c.trajectory_hash(), plain.trajectory_hash(), "{written}");
    }
    // Any other optimizer is another trajectory.
    let adam = Config::parse(&QUICK.replace("how = \"B\"", "how = \"B\"\noptimizer = \"adam\""))
        .expect("adam");
    assert_ne!(adam.trajectory_hash(), plain.trajectory_hash());
    // Written back and read again, the same settings.
    let again = Config::parse(&toml::to_string_pretty(&adam).unwrap()).expect("resolved");
    assert_eq!(again, adam);
}
