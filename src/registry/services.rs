//! Service names, interned: each entry stores a 2-byte [`ServiceId`] instead of the name.
//!
//! At most [`MAX_SERVICES`] names are *in use* at once (a name is in use while an alive, held
//! or listed-expired key has it), so a client inventing a new name per request cannot exhaust
//! memory; a name whose last key is gone is freed when room is needed, and its id reused.
//!
//! Freeing must never pull an id from under a key being written. An id is only used between
//! [`ServiceTable::pin`] and the end of the shard operation that stores it, and the pin holds
//! the id map's read lock for that long; freeing takes the write lock, so no pinned id is in
//! flight while it counts which ids the shards still use. Lock order: id map, then shards,
//! then the name list (shards read names under their lock; nothing takes the id map while
//! holding a shard).

use std::collections::HashMap;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::types::ServiceName;

/// Most service names in use at once: every id but [`ServiceId::NONE`] fits in the 16 bits an
/// entry keeps for it.
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

    /// The id at `index` (of a table of counts by index, or a test's).
    pub fn from_index(index: u16) -> Self {
        Self(index)
    }
}

#[derive(Debug, Default)]
struct Ids {
    by_name: HashMap<ServiceName, ServiceId>,
    /// Ids freed and not yet reused.
    free: Vec<ServiceId>,
    /// Ids ever handed out (the next new one is `issued + 1`).
    issued: usize,
}

/// The interning table.
#[derive(Debug, Default)]
pub struct ServiceTable {
    ids: RwLock<Ids>,
    /// `names[id - 1]`: the name of `id`, `None` once freed.
    names: RwLock<Vec<Option<ServiceName>>>,
}

/// The table is full: [`MAX_SERVICES`] names are in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceTableFull;

/// Keeps every interned id valid (none is freed) until dropped: hold it until the key that
/// takes the id is stored.
#[derive(Debug)]
pub struct Pin<'a>(#[allow(dead_code)] RwLockReadGuard<'a, Ids>);

impl ServiceTable {
    /// The id of `name`, interned if it is new, and a pin that keeps it valid. When the table
    /// is full, `in_use` says which ids the shards still use (`in_use[id]`; called with every
    /// pin released) and the others are freed first.
    pub fn pin(
        &self,
        name: &ServiceName,
        in_use: impl FnOnce() -> Vec<bool>,
    ) -> Result<(ServiceId, Pin<'_>), ServiceTableFull> {
        let ids = self.ids.read();
        if let Some(&id) = ids.by_name.get(name) {
            return Ok((id, Pin(ids)));
        }
        drop(ids);
        let mut ids = self.ids.write();
        if let Some(&id) = ids.by_name.get(name) {
            return Ok((id, Pin(RwLockWriteGuard::downgrade(ids))));
        }
        if ids.free.is_empty() && ids.issued >= MAX_SERVICES {
            self.free_unused(&mut ids, &in_use());
        }
        let id = match ids.free.pop() {
            Some(id) => id,
            None if ids.issued < MAX_SERVICES => {
                ids.issued += 1;
                ServiceId(u16::try_from(ids.issued).expect("at most MAX_SERVICES = u16::MAX ids"))
            }
            None => return Err(ServiceTableFull),
        };
        ids.by_name.insert(name.clone(), id);
        let mut names = self.names.write();
        if names.len() < id.index() {
            names.resize(id.index(), None);
        }
        names[id.index() - 1] = Some(name.clone());
        drop(names);
        Ok((id, Pin(RwLockWriteGuard::downgrade(ids))))
    }

    /// The id of `name` if it is interned (in use, or not yet freed).
    pub fn lookup(&self, name: &ServiceName) -> Option<ServiceId> {
        self.ids.read().by_name.get(name).copied()
    }

    /// The name of `id`; `None` for [`ServiceId::NONE`] (and for a freed id, which no key has).
    pub fn name(&self, id: ServiceId) -> Option<ServiceName> {
        let index = id.index().checked_sub(1)?;
        self.names.read().get(index).cloned().flatten()
    }

    /// Every interned `(id, name)`.
    pub fn all(&self) -> Vec<(ServiceId, ServiceName)> {
        let names = self.names.read();
        (1..=u16::MAX)
            .map(ServiceId)
            .zip(names.iter())
            .filter_map(|(id, name)| Some((id, name.clone()?)))
            .collect()
    }

    /// Names interned now.
    pub fn len(&self) -> usize {
        self.ids.read().by_name.len()
    }

    /// Frees every id the shards no longer use (with the write lock held: nothing is pinned).
    fn free_unused(&self, ids: &mut Ids, in_use: &[bool]) {
        let mut names = self.names.write();
        let unused: Vec<ServiceId> = (1..=ids.issued)
            .filter(|&index| !in_use.get(index).copied().unwrap_or(false))
            .map(|index| ServiceId(index as u16))
            .filter(|id| names[id.index() - 1].is_some())
            .collect();
        for &id in &unused {
            if let Some(name) = names[id.index() - 1].take() {
                ids.by_name.remove(&name);
            }
        }
        // Lowest ids last, so they are reused first.
        ids.free.extend(unused.into_iter().rev());
        tracing::info!(
            freed = ids.free.len(),
            in_use = ids.by_name.len(),
            "service names whose last key is gone were freed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: usize) -> ServiceName {
        ServiceName::new(&format!("svc-{n}")).unwrap()
    }

    #[test]
    fn a_full_table_frees_the_names_no_key_uses_and_reuses_their_ids() {
        let table = ServiceTable::default();
        let nothing_in_use = || -> Vec<bool> { panic!("not full yet") };
        for n in 0..MAX_SERVICES {
            let (id, _pin) = table.pin(&name(n), nothing_in_use).unwrap();
            assert_eq!(id.index(), n + 1);
        }
        assert_eq!(table.len(), MAX_SERVICES);
        // Full, and every name in use: refused.
        let all_in_use = || vec![true; MAX_SERVICES + 1];
        assert_eq!(
            table.pin(&name(MAX_SERVICES), all_in_use).err(),
            Some(ServiceTableFull)
        );
        // Only svc-7 (id 8) is still used: the others are freed, the new name takes id 1.
        let only_8 = || (0..=MAX_SERVICES).map(|index| index == 8).collect();
        let (id, _pin) = table.pin(&name(MAX_SERVICES), only_8).unwrap();
        assert_eq!(id.index(), 1);
        assert_eq!(table.len(), 2);
        assert_eq!(table.name(ServiceId(8)), Some(name(7)));
        assert_eq!(table.name(ServiceId(2)), None);
        assert_eq!(table.lookup(&name(0)), None);
        assert_eq!(table.lookup(&name(MAX_SERVICES)), Some(ServiceId(1)));
        let listed: Vec<u16> = table.all().iter().map(|(id, _)| id.0).collect();
        assert_eq!(listed, [1, 8]);
    }
}
