//! Tests of the task generation: shapes, seeds, sizing, needles and distractors.

use super::*;

/// A stand-in tokenizer: one token per whitespace-separated word (additive over the
/// space-joined pieces the sizing counts, as byte-level BPE pre-tokenizers are).
fn count(t: &str) -> Option<usize> {
    Some(t.split_whitespace().count())
}

fn build(s: &Settings) -> Vec<Group> {
    let h = Haystack::builtin().unwrap_or_else(|e| panic!("{e}"));
    let d = Draft::new(&h, s).unwrap_or_else(|e| panic!("{e}"));
    d.build(count).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn lengths_double_up_to_the_window() {
    assert_eq!(lengths(256, 1024), vec![256, 512, 1024]);
    assert_eq!(lengths(256, 1000), vec![256, 512, 1000]);
    assert_eq!(lengths(256, 256), vec![256]);
    assert_eq!(lengths(512, 256), vec![256]);
    assert_eq!(lengths(0, 3), vec![1, 2, 3]);
    assert!(lengths(256, 0).is_empty());
}

#[test]
fn every_group_holds_its_needles_and_its_answers_only_in_the_true_prompt() {
    let s = Settings {
        window: 2048,
        ..Settings::default()
    };
    let groups = build(&s);
    assert_eq!(groups.len(), 5 * 4);
    let mut ids: Vec<&str> = groups
        .iter()
        .flat_map(|g| g.queries.iter().map(|q| q.id.as_str()))
        .collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "query ids are unique");
    for g in &groups {
        assert_eq!(g.candidates(), 1 + s.distractors, "{}", g.id);
        assert_eq!(g.queries.len(), g.task.queries(g.length), "{}", g.id);
        for q in &g.queries {
            assert!((0.0..=1.0).contains(&q.depth), "{}", q.id);
            for e in &q.expected {
                assert!(
                    g.prompt.contains(e.as_str()),
                    "{}: {e} not in the haystack",
                    q.id
                );
            }
            for d in &q.distractors {
                assert_eq!(d.chars().count(), q.answer.chars().count(), "{}", q.id);
                assert_ne!(d, &q.answer);
                // exactly one element differs from the truth, and it is not in the text
                let fresh: Vec<&str> = d
                    .split([' ', ','])
                    .filter(|p| !p.is_empty() && !q.answer.contains(p))
                    .collect();
                assert_eq!(fresh.len(), 1, "{}: {d} vs {}", q.id, q.answer);
                assert!(
                    !g.prompt.contains(fresh[0]),
                    "{}: distractor {d} is in the text",
                    q.id
                );
            }
        }
        let (truth, spans) = g.candidate_prompt(0);
        for (q, sp) in g.queries.iter().zip(&spans) {
            assert_eq!(&truth[sp.clone()], q.answer, "{}", q.id);
        }
        for c in 1..g.candidates() {
            let (p, spans) = g.candidate_prompt(c);
            assert!(p.starts_with(&g.prompt));
            for (q, sp) in g.queries.iter().zip(&spans) {
                assert_eq!(&p[sp.clone()], q.distractors[c - 1], "{}", q.id);
            }
        }
        // the sizing filled the haystack up to the length (a sentence is < 25 words)
        assert!(g.tokens <= g.length as usize, "{} {}", g.id, g.tokens);
        assert!(g.tokens + 25 > g.length as usize, "{} {}", g.id, g.tokens);
        assert_eq!(count(&truth), Some(g.tokens), "{}", g.id);
        // the generation prompts end with each lead
        let gp = g.generation_prompts();
        assert_eq!(gp.len(), g.queries.len());
        for (p, q) in gp.iter().zip(&g.queries) {
            assert!(p.ends_with(&q.lead) && !p.ends_with(&q.answer));
        }
    }
}

#[test]
fn needles_sit_at_their_depths_in_order() {
    let s = Settings {
        tasks: vec![TaskKind::MultiQuery, TaskKind::VariableTracking],
        window: 1024,
        ..Settings::default()
    };
    for g in build(&s) {
        let mut at: Vec<(f64, usize)> = g
            .queries
            .iter()
            .map(|q| (q.depth, g.prompt.find(&q.expected[0]).unwrap_or(usize::MAX)))
            .collect();
        at.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(at.windows(2).all(|w| w[0].1 <= w[1].1), "{}: {at:?}", g.id);
        if g.task == TaskKind::VariableTracking {
            // the chain is written in assignment order
            let q = &g.queries[0];
            let pos: Vec<usize> = q
                .expected
                .iter()
                .map(|n| g.prompt.find(&format!("VAR {n} =")).unwrap_or(usize::MAX))
                .collect();
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "{pos:?}");
        }
    }
}

#[test]
fn seeds_decide_everything_and_groups_do_not_depend_on_each_other() {
    let a = build(&Settings::default());
    let b = build(&Settings::default());
    assert_eq!(a, b);
    let c = build(&Settings {
        seed: 1,
        ..Settings::default()
    });
    assert_ne!(a, c);
    let only = build(&Settings {
        tasks: vec![TaskKind::MultiQuery],
        ..Settings::default()
    });
    let same: Vec<&Group> = a
        .iter()
        .filter(|g| g.task == TaskKind::MultiQuery)
        .collect();
    assert_eq!(only.iter().collect::<Vec<_>>(), same);
}

#[test]
fn bad_settings_and_missing_counts_are_errors() {
    let h = Haystack::builtin().unwrap_or_else(|e| panic!("{e}"));
    for s in [
        Settings {
            tasks: vec![],
            ..Settings::default()
        },
        Settings {
            distractors: 0,
            ..Settings::default()
        },
        Settings {
            digits: 3,
            ..Settings::default()
        },
        Settings {
            distractors: 17,
            ..Settings::default()
        },
    ] {
        assert!(Draft::new(&h, &s).is_err(), "{s:?}");
    }
    let d = Draft::new(&h, &Settings::default()).unwrap_or_else(|e| panic!("{e}"));
    let texts = d.texts();
    assert!(texts.len() > h.filler.len());
    let first_fixed = texts[h.filler.len()].clone();
    let r = d.build(|t| (t != first_fixed).then_some(t.len() / 4));
    assert!(matches!(r, Err(LongctxError::Uncounted(_))), "{r:?}");
    assert!(Haystack::from_json(r#"{"description":"","filler":[],"keys":[]}"#).is_err());
    assert!(Haystack::from_json("{").is_err());
    for t in TaskKind::ALL {
        assert_eq!(TaskKind::parse(t.as_str()), Some(t));
    }
    assert_eq!(TaskKind::parse("nope"), None);
    assert_eq!(TaskKind::MultiQuery.queries(128), 2);
    assert_eq!(TaskKind::MultiQuery.queries(1024), 16);
    assert_eq!(TaskKind::MultiQuery.queries(8192), 16);
}
