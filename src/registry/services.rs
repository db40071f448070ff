//! Service names, interned: each entry stores a 2-byte [`ServiceId`] instead of the name.
//!
//! The table only grows (a name, once seen, keeps its id) and is capped at [`MAX_SERVICES`] names
//! so that a client inventing a new name per request cannot exhaust memory.

use std::collections::HashMap;

use parking_lot::RwLock;

use crate::types::ServiceName;

/// Most distinct service names the registry accepts: every id but [`ServiceId::NONE`] fits in
/// the 16 bits an entry keeps for it.
pub const MAX_SERVICES: usize = u16::MAX as usize;

/// A service's index in the table; `ServiceId::NONE` means "no service".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ServiceId(u16);

impl ServiceId {
    pub const NONE: Self = Self(0);

    pub fn is_none(self) -> bool {
        self == Self::NONE
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Default)]
struct Interned {
    ids: HashMap<ServiceName, ServiceId>,
    /// `names[id - 1]` is the name of `id`.
    names: Vec<ServiceName>,
}

/// The interning table.
#[derive(Debug, Default)]
pub struct ServiceTable {
    inner: RwLock<Interned>,
}

/// The table is full: [`MAX_SERVICES`] names are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceTableFull;

impl ServiceTable {
    /// The id of `name`, adding it if it is new.
    pub fn intern(&self, name: &ServiceName) -> Result<ServiceId, ServiceTableFull> {
        if let Some(&id) = self.inner.read().ids.get(name) {
            return Ok(id);
        }
        let mut inner = self.inner.write();
        if let Some(&id) = inner.ids.get(name) {
            return Ok(id);
        }
        if inner.names.len() >= MAX_SERVICES {
            return Err(ServiceTableFull);
        }
        inner.names.push(name.clone());
        let id = ServiceId(
            u16::try_from(inner.names.len()).expect("at most MAX_SERVICES = u16::MAX names"),
        );
        inner.ids.insert(name.clone(), id);
        Ok(id)
    }

    /// The id of `name` if it was ever interned.
    pub fn lookup(&self, name: &ServiceName) -> Option<ServiceId> {
        self.inner.read().ids.get(name).copied()
    }

    /// The name of `id`; `None` for [`ServiceId::NONE`].
    pub fn name(&self, id: ServiceId) -> Option<ServiceName> {
        let index = id.index().checked_sub(1)?;
        self.inner.read().names.get(index).cloned()
    }

    /// Every interned `(id, name)`.
    pub fn all(&self) -> Vec<(ServiceId, ServiceName)> {
        let inner = self.inner.read();
        (1..)
            .map(ServiceId)
            .zip(inner.names.iter().cloned())
            .collect()
    }
}
