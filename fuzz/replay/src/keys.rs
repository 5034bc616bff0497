//! The keys every target signs and verifies with: key 1 signs, key 2 only verifies.
use std::sync::OnceLock;

use mcp_resume_core::cursor::{Key, Keyring};

pub const ACTIVE: u8 = 1;
pub const VERIFY_ONLY: u8 = 2;

pub fn secret(id: u8) -> [u8; 32] {
    [0x40 ^ id; 32]
}

pub fn keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| {
        let key = |id| Key {
            id,
            secret: secret(id).to_vec(),
        };
        match Keyring::new(key(ACTIVE), vec![key(VERIFY_ONLY)]) {
            Ok(r) => r,
            Err(e) => unreachable!("fixed test keys: {e}"),
        }
    })
}
