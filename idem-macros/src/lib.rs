//! Procedural macros for idem. Depend on `idem-runtime`, which re-exports them.
