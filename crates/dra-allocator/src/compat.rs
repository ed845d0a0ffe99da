//! Device compatibility groups (DRADeviceCompatibilityGroups): the devices drawing on one
//! counter set of a pool must all share a group. A device that declares no groups goes
//! only with other such devices; the first device on a counter set may be anything. The
//! running state of a counter set is the intersection of its devices' groups, seeded by
//! the devices allocated before this attempt.

/// A device's groups for one counter set: at most two (the API's limit), as interned ids
/// of its pool, sorted; none means "no groups".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Groups {
    ids: [u32; 2],
    len: u8,
}

impl Groups {
    /// The first two of `ids` (sorted, unique); the API allows no more.
    pub fn new(ids: &[u32]) -> Groups {
        let mut g = Groups::default();
        for &id in ids.iter().take(2) {
            g.ids[g.len as usize] = id;
            g.len += 1;
        }
        g
    }

    fn ids(&self) -> &[u32] {
        &self.ids[..self.len as usize]
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn intersect(&self, other: &Groups) -> Groups {
        let both: Vec<u32> = self
            .ids()
            .iter()
            .copied()
            .filter(|id| other.ids().contains(id))
            .collect();
        Groups::new(&both)
    }
}

/// The state of one counter set: which devices may still join it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Intersection {
    /// Some device is on the counter set.
    members: bool,
    /// Every device on it declared no groups.
    all_empty: bool,
    /// The groups every device on it shares (when some declared groups).
    groups: Groups,
}

impl Intersection {
    /// Whether a device with `groups` may join.
    pub fn admits(&self, groups: &Groups) -> bool {
        if !self.members {
            return true;
        }
        if groups.is_empty() {
            return self.all_empty;
        }
        !self.all_empty && !self.groups.intersect(groups).is_empty()
    }

    /// The state with a device of `groups` added (which [`Intersection::admits`] allowed).
    pub fn add(&self, groups: &Groups) -> Intersection {
        if !self.members {
            return Intersection {
                members: true,
                all_empty: groups.is_empty(),
                groups: *groups,
            };
        }
        if self.all_empty || groups.is_empty() {
            return *self;
        }
        Intersection {
            groups: self.groups.intersect(groups),
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_join_a_counter_set_while_they_share_a_group() {
        let none = Groups::new(&[]);
        let (a, b, ab) = (Groups::new(&[1]), Groups::new(&[2]), Groups::new(&[1, 2]));
        let empty = Intersection::default();
        assert!(empty.admits(&a) && empty.admits(&none));
        let with_ab = empty.add(&ab);
        assert!(with_ab.admits(&a) && with_ab.admits(&b) && !with_ab.admits(&none));
        let with_a = with_ab.add(&a);
        assert!(with_a.admits(&ab) && !with_a.admits(&b));
        let with_none = empty.add(&none);
        assert!(with_none.admits(&none) && !with_none.admits(&a));
        assert_eq!(with_none.add(&none), with_none);
    }
}
