//! Acuerdo (work in progress).
