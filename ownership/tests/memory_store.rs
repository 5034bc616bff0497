//! The shared store suite against the in-memory store.
mod suite;

use mcp_ownership::MemoryStore;

store_suite!(MemoryStore::new);
