//! The configuration's unit tests: the example parses with its defaults, each invalid value is
//! an error naming its key and line.

use super::*;

const GOOD: &str = r#"
[server]
listen = "127.0.0.1:0"

[providers.a]
base_url = "http://127.0.0.1:9/v1/"
price_input_per_mtok = 0.5
price_output_per_mtok = 1.5

[models.m]
policy = "cheapest"
[[models.m.endpoints]]
provider = "a"
model = "m-1"
"#;

/// A duration near u64::MAX milliseconds overflowed `Instant + Duration` (a panic on the
/// first request that used it): every duration key is bounded, and the error names it.
#[test]
fn durations_past_the_bound_are_config_errors_naming_the_key() {
    let huge = u64::MAX;
    for (table, key) in [
        ("providers.a", "connect_timeout_ms"),
        ("providers.a", "first_byte_timeout_ms"),
        ("providers.a", "idle_timeout_ms"),
        ("limits", "backoff_base_ms"),
        ("limits", "backoff_max_ms"),
        ("limits", "retry_after_max_ms"),
        ("limits", "key_cache_ttl_ms"),
        ("limits", "key_stale_grace_ms"),
        ("breaker", "window_ms"),
        ("breaker", "cooldown_ms"),
        ("server", "alert_poll_ms"),
        ("server", "drain_timeout_ms"),
        ("models.m", "hedge_after_ms"),
    ] {
        let src = GOOD.replacen(
            &format!("[{table}]\n"),
            &format!("[{table}]\n{key} = {huge}\n"),
            1,
        );
        let src = if src.contains(&format!("{key} = ")) {
            src
        } else {
            format!("{GOOD}\n[{table}]\n{key} = {huge}\n")
        };
        let err = Config::from_toml_str(&src).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains(key) && e.contains("at most")),
            "{table}.{key} = {huge}: {err:?}"
        );
        let ok = src.replace(&huge.to_string(), &MAX_DURATION_MS.to_string());
        assert!(
            Config::from_toml_str(&ok).is_ok(),
            "{table}.{key} at the bound"
        );
    }
}

#[test]
fn good_config_parses_with_defaults() {
    let c = Config::from_toml_str(GOOD).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.providers["a"].base_url, "http://127.0.0.1:9/v1");
    assert_eq!(c.models["m"].policy, Policy::Cheapest);
    assert_eq!(c.models["m"].endpoints[0].weight, 1.0);
    assert_eq!(c.limits.max_attempts, 3);
    assert_eq!(c.limits.max_streams_per_key, 256);
    // one serving thread per CPU unless set
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(c.server.threads, cpus);
    let two = GOOD.replace("[server]\n", "[server]\nthreads = 2\n");
    let c2 = Config::from_toml_str(&two).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c2.server.threads, 2);
    // no cross-origin calls unless origins are listed
    assert_eq!(c.server.cors, None);
    let listed = GOOD.replace("[server]\n", "[server]\ncors_allow_origins = [\"*\"]\n");
    let c3 = Config::from_toml_str(&listed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c3.server.cors.as_deref(), Some(&crate::cors::Cors::Any));
    // one origin may be given as a string
    let one = GOOD.replace(
        "[server]\n",
        "[server]\ncors_allow_origins = \"http://a.example\"\n",
    );
    let c4 = Config::from_toml_str(&one).unwrap_or_else(|e| panic!("{e}"));
    let only = crate::cors::Cors::Only(vec!["http://a.example".to_owned()]);
    assert_eq!(c4.server.cors.as_deref(), Some(&only));
    // neither a list nor a string: the error says what is expected, and where
    let wrong = GOOD.replace("[server]\n", "[server]\ncors_allow_origins = 3\n");
    let err = Config::from_toml_str(&wrong)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("line 3") && err.contains("server.cors_allow_origins: a list of origins"),
        "{err}"
    );
    assert!(c.summary().contains("model m"));
    let none = format!("{GOOD}\n[limits]\nmax_streams_per_key = 0\n");
    let err = Config::from_toml_str(&none)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("limits.max_streams_per_key"), "{err}");
    assert_eq!(
        c.limits.record_queue_bytes,
        samewise_store::DEFAULT_MAX_QUEUED_RECORD_BYTES
    );
    let tiny = format!("{GOOD}\n[limits]\nrecord_queue_bytes = 100\n");
    let err = Config::from_toml_str(&tiny)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("limits.record_queue_bytes") && err.contains("at least 4096"),
        "{err}"
    );
    let set = format!("{GOOD}\n[limits]\nrecord_queue_bytes = 1048576\n");
    let c = Config::from_toml_str(&set).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.limits.record_queue_bytes, 1 << 20);
}

/// The parser names neither the key nor the table of a value of the wrong type ("invalid type:
/// string \"lots\", expected u64"): the error quotes the line after its table's header.
#[test]
fn a_value_of_the_wrong_type_is_quoted_with_its_table() {
    let err = |src: &str| {
        Config::from_toml_str(src)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let e = err(&GOOD.replace(
        "price_input_per_mtok = 0.5",
        "price_input_per_mtok = \"cheap\"",
    ));
    assert!(
        e.starts_with("config error at line 7 (`[providers.a] price_input_per_mtok = \"cheap\"`): invalid type"),
        "{e}"
    );
    let e = err(&GOOD.replace("provider = \"a\"", "provider = 7"));
    assert!(
        e.contains("at line 13 (`[[models.m.endpoints]] provider = 7`)"),
        "{e}"
    );
    // a long line is cut; a header's own error quotes only the header
    let long = format!("x{}", "y".repeat(300));
    let e = err(&GOOD.replace(
        "price_input_per_mtok = 0.5",
        &format!("price_input_per_mtok = \"{long}\""),
    ));
    assert!(e.contains("yyyy…`)"), "{e}");
    let e = err(&GOOD.replace("[models.m]", "[models.m]]"));
    assert!(e.contains("(`[models.m]]`)"), "{e}");
}

#[test]
fn unknown_key_names_key_and_line() {
    let src = GOOD.replace(
        "price_output_per_mtok = 1.5",
        "price_output_per_mtok = 1.5\nbogus_key = 3",
    );
    let err = Config::from_toml_str(&src)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("bogus_key"), "{err}");
    assert!(err.contains("line 9"), "{err}");
}

#[test]
fn unknown_provider_names_key_and_line() {
    let src = GOOD.replace("provider = \"a\"", "provider = \"nope\"");
    let err = Config::from_toml_str(&src)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("models.m.endpoints[0].provider"), "{err}");
    assert!(err.contains("line 13"), "{err}");
}

#[test]
fn bad_values_are_rejected() {
    for (from, to, key) in [
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"nowhere\"",
            "server.listen",
        ),
        (
            "base_url = \"http://127.0.0.1:9/v1/\"",
            "base_url = \"ftp://x\"",
            "providers.a.base_url",
        ),
        (
            "price_input_per_mtok = 0.5",
            "price_input_per_mtok = -1.0",
            "providers.a.price_input_per_mtok",
        ),
        ("policy = \"cheapest\"", "policy = \"fastest\"", "fastest"),
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\nthreads = 0",
            "server.threads",
        ),
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\nthreads = 1025",
            "server.threads",
        ),
        (
            "listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:0\"\ncors_allow_origins = [\"http://a.example\", \"a.example/\"]",
            "server.cors_allow_origins[1]",
        ),
    ] {
        let src = GOOD.replace(from, to);
        let err = Config::from_toml_str(&src)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(key), "{key}: {err}");
        assert!(err.contains("line"), "{key}: {err}");
    }
}

#[test]
fn first_byte_floor_and_hedging_defaults_and_bounds() {
    let c = Config::from_toml_str(GOOD).unwrap_or_else(|e| panic!("{e}"));
    let a = &c.providers["a"];
    assert_eq!(a.first_byte_timeout, Duration::from_secs(60));
    assert_eq!(a.first_byte_floor, Duration::from_secs(1));
    assert_eq!(c.models["m"].hedge_after, None, "hedging is off by default");

    // a cap below the default floor lowers the floor with it
    let small_cap = GOOD.replace(
        "price_input_per_mtok = 0.5",
        "price_input_per_mtok = 0.5\nfirst_byte_timeout_ms = 300",
    );
    let c = Config::from_toml_str(&small_cap).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.providers["a"].first_byte_floor,
        Duration::from_millis(300)
    );

    // an explicit floor above the cap is an error naming the key and its line
    let above = GOOD.replace(
        "price_input_per_mtok = 0.5",
        "price_input_per_mtok = 0.5\nfirst_byte_timeout_ms = 300\nfirst_byte_floor_ms = 301",
    );
    let err = Config::from_toml_str(&above).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("providers.a.first_byte_floor_ms")
                && e.contains("line 9")
                && e.contains("at most first_byte_timeout_ms")),
        "{err:?}"
    );

    for (value, ok) in [("0", false), ("250", true)] {
        let src = GOOD.replace(
            "policy = \"cheapest\"",
            &format!("policy = \"cheapest\"\nhedge_after_ms = {value}"),
        );
        let parsed = Config::from_toml_str(&src);
        assert_eq!(
            parsed.is_ok(),
            ok,
            "hedge_after_ms = {value}: {:?}",
            parsed.err()
        );
        if let Ok(c) = parsed {
            assert_eq!(c.models["m"].hedge_after, Some(Duration::from_millis(250)));
        }
    }
}

#[test]
fn capture_is_off_by_default_and_its_bounds_are_checked() {
    let c = Config::from_toml_str(GOOD).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.models["m"].capture, None);
    let on = format!("{GOOD}[models.m.capture]\nenabled = true\n");
    let c = Config::from_toml_str(&on).unwrap_or_else(|e| panic!("{e}"));
    let cap = c.models["m"]
        .capture
        .unwrap_or_else(|| panic!("capture on"));
    assert_eq!(
        (cap.max_bytes, cap.max_age, cap.max_body_bytes, cap.sample),
        (
            CAPTURE_MAX_BYTES,
            Duration::from_secs(CAPTURE_MAX_AGE_HOURS * 3600),
            CAPTURE_MAX_BODY_BYTES as usize,
            0.0
        )
    );
    let off = format!(
        "{GOOD}[models.m.capture]\nenabled = false\nmax_bytes = 4096\nmax_body_bytes = 1024\n"
    );
    let c = Config::from_toml_str(&off).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.models["m"].capture, None);
    for (extra, key) in [
        (
            "max_bytes = 10\nmax_body_bytes = 100",
            "models.m.capture.max_bytes",
        ),
        ("max_body_bytes = 0", "models.m.capture.max_body_bytes"),
        ("max_age_hours = 0", "models.m.capture.max_age_hours"),
        ("max_age_hours = 100000", "models.m.capture.max_age_hours"),
        ("sample = 1.5", "models.m.capture.sample"),
        ("keep_headers = true", "keep_headers"),
    ] {
        let src = format!("{GOOD}[models.m.capture]\nenabled = true\n{extra}\n");
        let err = Config::from_toml_str(&src)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(key), "{extra}: {err}");
        assert!(err.contains("line"), "{extra}: {err}");
    }
}

/// `[retention]`: 30 days of records, 400 of rollups and probe runs and 7 of the runs' raw
/// data unless set; 0 keeps them for ever; a
/// value past 100 years or an unknown key is an error naming it and its line.
#[test]
fn retention_days_default_zero_keeps_and_bounds_name_the_key() {
    const DAY: Duration = Duration::from_secs(86_400);
    let c = Config::from_toml_str(GOOD).expect("the good config parses");
    assert_eq!(c.retention.records, Some(DAY * 30));
    assert_eq!(c.retention.rollups, Some(DAY * 400));
    assert_eq!(c.retention.probe_raw, Some(DAY * 7));
    let c = Config::from_toml_str(&format!(
        "{GOOD}\n[retention]\nrecords_days = 0\nrollups_days = 7\nprobe_raw_days = 2\n"
    ))
    .expect("retention parses");
    assert_eq!(
        (
            c.retention.records,
            c.retention.rollups,
            c.retention.probe_raw
        ),
        (None, Some(DAY * 7), Some(DAY * 2))
    );
    assert!(
        c.summary().contains(
            "retention: records for ever, rollups and probe runs 7 days, probe runs' raw data 2 days\n"
        ),
        "{}",
        c.summary()
    );
    let src = format!("{GOOD}\n[retention]\nrecords_days = 36501\n");
    let line = src
        .lines()
        .position(|l| l.starts_with("records_days"))
        .map(|i| i + 1);
    let err = Config::from_toml_str(&src).err().map(|e| e.to_string());
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("retention.records_days")
                && e.contains("at most 36500")
                && e.contains(&format!("line {}", line.unwrap_or(0)))),
        "{err:?}"
    );
    let err = Config::from_toml_str(&format!("{GOOD}\n[retention]\nrecords = 3\n"))
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("records")),
        "{err:?}"
    );
}
