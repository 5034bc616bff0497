//! `config_parse`: the plugin configuration parser (`Config::from_json`) on arbitrary bytes.
//!
//! Invariants: an error names a field and says what is wrong; a configuration that loads
//! holds what validation promises, and its keyring mints cursors it verifies.
use mcp_resume_core::config::{Config, PathMatch};
use mcp_resume_core::cursor::Cursor;
use mcp_resume_core::ownership::StreamKind;

pub fn config_parse(data: &[u8]) {
    match Config::from_json(data) {
        Err(e) => {
            assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
            assert!(e.to_string().starts_with("invalid config: "));
        }
        Ok(cfg) => {
            assert!(!cfg.paths.is_empty());
            for p in &cfg.paths {
                let (PathMatch::Exact(s) | PathMatch::Prefix(s)) = p;
                assert!(s.starts_with('/'));
                assert!(cfg.is_mcp_path(s), "{s:?} does not match itself");
            }
            let o = &cfg.ownership;
            assert!(!o.cluster.is_empty() && !o.authority.is_empty());
            assert!((1..=60_000).contains(&o.timeout_ms));
            assert!(o.max_batch >= 1 && o.max_queue >= o.max_batch);
            assert!((400..=499).contains(&cfg.reject_status));
            assert!(!matches!(cfg.reject_status, 404 | 405));
            assert!(cfg.max_event_hold_bytes >= 1024);
            assert!(!cfg.owner_header.is_empty());
            assert!(cfg
                .owner_header
                .bytes()
                .all(|b| !b.is_ascii_uppercase() && b.is_ascii_graphic()));
            let ids: Vec<u8> = cfg.keyring.key_ids().collect();
            assert_eq!(ids.first(), Some(&cfg.keyring.active_id()));
            let c = Cursor {
                request_id: None,
                session: [7; 8],
                incarnation: 9,
                kind: StreamKind::Get,
                seq: 3,
                replica_event_id: Some("r"),
            };
            let d = cfg.keyring.decode(&cfg.keyring.encode(&c));
            assert_eq!(
                d.map(|d| (d.key_id, d.seq)),
                Ok((cfg.keyring.active_id(), 3))
            );
        }
    }
}
