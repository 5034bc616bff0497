//! The keys every target signs and verifies with: key 1 signs, key 2 only verifies.
use std::sync::OnceLock;

use mcp_resume_core::cursor::{Key, Keyring};

pub const ACTIVE: u8 = 1;
pub const VERIFY_ONLY: u8 = 2;

/// Fixed, random-looking bytes per id (xorshift): the config parser refuses repeated bytes.
pub fn secret(id: u8) -> [u8; 32] {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(id);
    std::array::from_fn(|_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s.to_be_bytes()[0]
    })
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
