//! Offline tools the `percore` binary runs besides `serve`: `fsck` checks a
//! stopped data directory, `doctor` checks the machine.

pub mod doctor;
pub mod fsck;
