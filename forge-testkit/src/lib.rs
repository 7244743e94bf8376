//! FORGE test kit (in progress).
