//! The typed StableHLO builder.
