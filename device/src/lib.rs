//! The perfbed monitoring device model.
//!
//! Not written yet: the device, its register map and the control socket are
//! the work of the device issue. This crate exists so that the workspace has
//! its final shape; it exports nothing, so nothing can mistake it for done.
