//! A deterministic simulator of mcp-resume-guard (docs/simulator.md): one process, one seed,
//! many gateways (the real guard core), the ownership service's memory store and handlers,
//! replicas with a menu of behaviours, and clients whose parser is the oracle's eye.
pub mod client;
pub mod gateway;
pub mod network;
pub mod options;
pub mod oracle;
pub mod replica;
pub mod rng;
pub mod run;
pub mod service;
pub mod world;
