//! The search for one node: candidate devices per request (static checks and selectors,
//! cached), then a complete depth-first search in upstream order (claims, requests,
//! subrequests, pools by driver/name, slices by name, devices in slice order; combinations,
//! not permutations), with pruning that never changes which solution is found first:
//!
//! * counting bounds: a request cannot be met with fewer usable candidates than it needs,
//!   and all remaining requests together cannot take more devices than their candidates hold;
//!   both count what shared counters and consumable capacity still allow (below);
//! * matchAttribute supply: once a constraint's value is fixed, the devices still needed by
//!   the requests it covers must exist with that value;
//! * symmetry: a device identical to one that already failed at the same step (same
//!   attributes, capacity, counters, taints, placement; unused) is not tried again;
//! * memoisation of failed states at request boundaries, keyed up to symmetry.
//!
//! ## Counter and capacity bounds
//!
//! The counting bounds use an upper bound on how many devices (or shares of a shared
//! device) a set of candidates can still give in the current state:
//!
//! * a device that consumes no counters and is not shared: 1 if it is free;
//! * devices that consume shared counters (partitionable devices), grouped by the counter
//!   set of their first counter: for a group `G` and any counter `k` it consumes, at most
//!   `fit_k + |G not consuming k|`, where `fit_k` is how many of `G`'s devices that consume
//!   `k` fit in what is left of `k` when taken smallest amount first; the group gives at
//!   most the minimum of that over its counters (seven 1g.5gb MIG devices per A100: its
//!   108 multiprocessors hold seven of 14, although it has eight memory slices);
//! * a shared device (allowMultipleAllocations): at most one share per remaining request
//!   (a request never takes a device twice) and, per capacity, at most the requests whose
//!   smallest needs fit in the capacity left, plus those that need none of it.
//!
//! `fill` bounds the request it fills, from the candidate it has reached; at each request
//! boundary, each remaining request alone is bounded, then all remaining non-admin requests
//! together (each free device once, devices that consume counters through their pool's
//! counter groups, cached per pool in the snapshot, shared devices by their shares). The
//! static part (which candidates consume counters, sorted by amount per counter) is built
//! once per node, and only for requests whose candidates together could overfill some
//! counter; other requests keep the plain count.
//!
//! Why this never cuts a branch that has a solution: below any search state the devices in
//! use, the counters consumed and the capacity allocated only grow (amounts are not
//! negative; a counter some device consumes a negative amount of is left out), and every
//! device added must fit what is left of each counter it consumes (`try_add` checks
//! the sum) and of each capacity. So the devices a solution still adds from `G`
//! that consume `k` have amounts summing to at most what is left of `k`, and no set of
//! items fits more of them than the smallest ones do; the others are at most all of `G`'s
//! devices not consuming `k`. Groups, counters and capacities are relaxed independently
//! (each may use all that is left), which only makes the bound larger. A shared device
//! consumes its counters only on its first share; the bound does not count its counters
//! beyond checking that a first share still fits. Devices with a pending error (raised
//! only when the search reaches them, as upstream does) count as free devices, and a
//! request with such errors keeps the plain count, so pruning reaches them as before.

use std::collections::{BTreeMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceTaint, DeviceToleration};

use crate::attr::{AttrValue, ConstraintState, lookup};
use crate::capacity::consumption;
use crate::error::AllocError;
use crate::outcome::{
    Allocation, Explanation, Limits, Outcome, Picked, Quality, RequestExplanation,
};
use crate::plan::{ConstraintKind, MAX_RESULTS_PER_CLAIM, Plan, ReqPlan};
use crate::quantity::Quantity;
use crate::snapshot::{NUMA_ATTRIBUTE, PoolInfo, PoolState, Snapshot, device_node_matches};
use crate::{NumMap, NumSet};

const MEMO_LIMIT: usize = 1 << 20;

/// A device as this node sees it.
struct Dev {
    entry: u32,
    pool: u32,
    multi: bool,
    /// Allocated exclusively by a claim outside this attempt.
    taken: bool,
    /// Shared by claims outside this attempt (counts as "capacity in use").
    shared: bool,
    /// Capacity consumed outside this attempt, aligned with the entry's capacities.
    /// (Boxed slices, as `consumes`: empty ones are a null pointer and a length, so a
    /// device without either is quick to write.)
    used_capacity: Box<[Quantity]>,
    /// (pool counter index, amount).
    consumes: Box<[(usize, Quantity)]>,
    /// Not shared and consumes some counter: counted by counter groups in bounds.
    counted: bool,
    sym: u32,
}

/// A node's NUMA domains for the score: ((pool, NUMA value), (all its devices free before,
/// all free after)). A node has a few: on the stack.
type NumaDomains = smallvec::SmallVec<[((u32, u32), (bool, bool)); 8]>;

/// How a candidate counts in its request's bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One device, if usable.
    Plain,
    /// A shared device: one share, if usable and it fits.
    Shared,
    /// Counted by its [`CounterGroup`].
    Counted,
}

/// A device's use of one counter: (amount, position in the request's list, device).
type CounterUse = (Quantity, u32, u32);

/// Devices that consume one counter set of a pool, for the counter bound: a request's
/// candidates, or (cached in [`crate::snapshot::PoolStatic`]) all of a pool's devices,
/// where positions and devices are indexes into the pool's entries.
#[derive(Debug, Default)]
pub(crate) struct CounterGroup {
    pool: u32,
    /// (position in the request's list, device).
    members: Vec<(u32, u32)>,
    /// The counters that can bind: (flat counter index, the members that consume it as
    /// (amount, position, device), smallest amount first).
    counters: Vec<(usize, Vec<CounterUse>)>,
}

/// What a request's bound needs, static per node.
#[derive(Default)]
struct ReqBound {
    /// Whether counters or capacity can bind; if not, the bound counts usable candidates.
    active: bool,
    /// Per position in the request's list (`cand`, or `all` for All).
    kind: Vec<Kind>,
    groups: Vec<CounterGroup>,
}

/// One remaining request (group) that may take a share of a shared device, for the
/// together bound: its need (per capacity, the smallest over its alternatives) is at
/// `needs[off..]`.
struct ShareUse {
    dev: u32,
    group: u32,
    off: u32,
}

/// The together bound's record of shares.
#[derive(Default)]
struct Shares {
    uses: Vec<ShareUse>,
    needs: Vec<Quantity>,
    /// Per device, its latest entry in `uses`.
    slot: Vec<u32>,
}

#[derive(Default)]
struct ReqRun {
    /// Candidate devices for ExactCount, in search order.
    cand: Vec<u32>,
    /// For All: every matching device, all of which must be allocatable.
    all: Vec<u32>,
    /// Devices in `all` that can never be taken (taint, feature off, broken).
    blocked: NumSet<u32>,
    /// Errors found for a device, raised only if the search reaches it (as upstream).
    errors: NumMap<u32, AllocError>,
    /// Capacity consumption per device (aligned with its capacities), for feasible devices.
    need: NumMap<u32, Vec<Quantity>>,
    /// Whether any candidate may be shared (allowMultipleAllocations).
    any_multi: bool,
    bound: ReqBound,
    stats: RequestExplanation,
}

impl ReqRun {
    /// Empty, keeping capacity.
    fn clear(&mut self) {
        self.cand.clear();
        self.all.clear();
        self.blocked.clear();
        self.errors.clear();
        self.need.clear();
        self.any_multi = false;
        self.bound.active = false;
        self.bound.kind.clear();
        self.bound.groups.clear();
        self.stats = RequestExplanation::default();
    }
}

struct Pick {
    req: usize,
    dev: u32,
    share: bool,
    consumed: Option<Vec<Quantity>>,
}

struct Undo {
    req: usize,
    dev: u32,
    counters: bool,
    /// Counter sets whose compatibility-group state this device changed (on `compat_undo`).
    compat: usize,
    constraints: usize,
    marked: bool,
    capacity: bool,
}

pub(crate) struct NodeRun<'a> {
    snap: &'a Snapshot,
    plan: &'a Plan,
    node: &'a Node,
    node_name: &'a str,
    limits: Limits<'a>,
    pools: Vec<PoolInfo>,
    devs: Vec<Dev>,
    reqs: Vec<ReqRun>,
    /// Per constraint of each claim: the attribute value of every device.
    attr_values: Vec<Vec<Vec<Option<AttrValue>>>>,
    // Mutable search state.
    claim_mask: Vec<u64>,
    alloc_capacity: Vec<Option<Vec<Quantity>>>,
    alloc_shares: Vec<u32>,
    consumed: Vec<Vec<Quantity>>,
    /// Per pool and counter set, the compatibility groups of the devices on it (only for
    /// pools that declare groups), and the states replaced, for undo.
    compat: Vec<Vec<crate::compat::Intersection>>,
    compat_undo: Vec<(u32, u32, crate::compat::Intersection)>,
    /// DRADerivedAttributes: (device entry, expression) → the value it yields.
    derived: NumMap<(u32, String), Option<AttrValue>>,
    cstate: Vec<Vec<ConstraintState>>,
    results: Vec<Vec<Pick>>,
    chosen: Vec<Option<usize>>,
    memo: NumSet<u128>,
    /// Search exactly like upstream, without pruning: set when an `All` request is covered
    /// by a constraint, where upstream reports a constraint clash as an error for the whole
    /// attempt only if its search reaches it, and pruning could skip that point.
    faithful: bool,
    steps: u64,
    marks: Vec<u32>,
    epoch: u32,
    /// Kept for [`Snapshot::gather_pools`] of the next attempt.
    seen: Vec<(u32, i64, u32)>,
    /// (pool, counter) that some device of this node consumes a negative amount of: what is
    /// left of it may grow, so it bounds nothing.
    negative: Vec<(u32, usize)>,
    /// No device is shared or consumes counters: the bounds count devices.
    plain: bool,
    /// Scratch of the together bound for shared devices.
    shares: Option<Box<Shares>>,
    /// The thread's scratch, its buffers taken into the fields above; they go back on drop.
    home: Option<Box<Scratch>>,
}

/// The buffers of one attempt, kept per thread for the next one (emptied, capacity kept),
/// so that the per-node path allocates little besides its answer.
#[derive(Default)]
struct Scratch {
    pools: Vec<PoolInfo>,
    seen: Vec<(u32, i64, u32)>,
    devs: Vec<Dev>,
    claim_mask: Vec<u64>,
    alloc_capacity: Vec<Option<Vec<Quantity>>>,
    alloc_shares: Vec<u32>,
    marks: Vec<u32>,
    chosen: Vec<Option<usize>>,
    reqs: Vec<ReqRun>,
    results: Vec<Vec<Pick>>,
    attr_values: Vec<Vec<Vec<Option<AttrValue>>>>,
    consumed: Vec<Vec<Quantity>>,
    cstate: Vec<Vec<ConstraintState>>,
    compat: Vec<Vec<crate::compat::Intersection>>,
}

thread_local! {
    /// Boxed: an attempt takes it and gives it back as a pointer, not a copy of every
    /// buffer's header.
    static SCRATCH: std::cell::RefCell<Option<Box<Scratch>>> =
        const { std::cell::RefCell::new(None) };
}

fn emptied<T>(v: &mut Vec<T>) -> Vec<T> {
    let mut v = std::mem::take(v);
    v.clear();
    v
}

impl Drop for NodeRun<'_> {
    fn drop(&mut self) {
        let mut reqs = std::mem::take(&mut self.reqs);
        for r in &mut reqs {
            r.clear();
        }
        let mut results = std::mem::take(&mut self.results);
        for r in &mut results {
            r.clear();
        }
        let mut attr_values = std::mem::take(&mut self.attr_values);
        for per_claim in &mut attr_values {
            for values in per_claim {
                values.clear();
            }
        }
        let mut sc = self.home.take().unwrap_or_default();
        sc.attr_values = attr_values;
        sc.pools = emptied(&mut self.pools);
        sc.seen = emptied(&mut self.seen);
        sc.devs = emptied(&mut self.devs);
        sc.claim_mask = emptied(&mut self.claim_mask);
        sc.alloc_capacity = emptied(&mut self.alloc_capacity);
        sc.alloc_shares = emptied(&mut self.alloc_shares);
        sc.marks = emptied(&mut self.marks);
        sc.chosen = emptied(&mut self.chosen);
        sc.consumed = std::mem::take(&mut self.consumed);
        sc.cstate = std::mem::take(&mut self.cstate);
        sc.compat = emptied(&mut self.compat);
        sc.reqs = reqs;
        sc.results = results;
        // Nothing to keep if the thread is going away.
        let _ = SCRATCH.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                *s = Some(sc);
            }
        });
    }
}

fn taint_blocks(taints: &[DeviceTaint], tolerations: &[DeviceToleration]) -> bool {
    taints.iter().any(|t| {
        matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    })
}

/// Kubernetes' device toleration rule.
pub(crate) fn tolerates(tol: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if tol
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if tol
        .key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("") {
        "" | "Equal" => tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        "Exists" => true,
        _ => false,
    }
}

fn hash128<T: Hash>(v: &T) -> u128 {
    let mut a = DefaultHasher::new();
    1u8.hash(&mut a);
    v.hash(&mut a);
    let mut b = DefaultHasher::new();
    2u8.hash(&mut b);
    v.hash(&mut b);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

impl<'a> NodeRun<'a> {
    pub(crate) fn new(
        snap: &'a Snapshot,
        plan: &'a Plan,
        node: &'a Node,
        limits: Limits<'a>,
    ) -> Result<Self, AllocError> {
        if plan.claims.len() > 64 {
            return Err(AllocError::InvalidClaim {
                claim: plan.claims[64].display.clone(),
                message: "at most 64 claims per pod are supported".into(),
            });
        }
        // Buffers left by the previous attempt on this thread (emptied, capacity kept).
        let mut sc: Box<Scratch> = SCRATCH
            .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.take()))
            .ok()
            .flatten()
            .unwrap_or_default();
        let mut pools = std::mem::take(&mut sc.pools);
        snap.gather_pools(node, &mut pools, &mut sc.seen)?;
        let features = snap.features();
        let ndev: usize = pools
            .iter()
            .filter(|p| p.state == PoolState::Usable)
            .map(|p| p.entries.len())
            .sum();
        let mut devs = std::mem::take(&mut sc.devs);
        // No device is shared or consumes counters.
        let mut plain = true;
        devs.reserve(ndev);
        for (pi, pool) in pools.iter().enumerate() {
            if pool.state != PoolState::Usable {
                continue;
            }
            // Written in place (extend over a slice): a push would build each device on
            // the stack first and copy it, a store-forwarding stall per device.
            let base = devs.len();
            devs.extend(pool.entries.iter().enumerate().map(|(k, &entry)| {
                let e = &snap.devices[entry as usize];
                let usage = snap.entry_usage(entry);
                let multi = features.consumable_capacity && e.view.multi;
                // Shared devices track capacity across allocations; so does a device that is
                // not shared but whose id shared allocations use (a device of that name in
                // another slice of the pool, or one that allowed sharing before): upstream
                // checks every device's full capacity against what shares consumed.
                let consumed_by_shares = usage.is_some_and(|u| !u.consumed.is_empty());
                let used_capacity = if !multi && !consumed_by_shares {
                    Box::default()
                } else {
                    snap.parsed(entry)
                        .capacity
                        .iter()
                        .map(|c| {
                            usage
                                .and_then(|u| u.consumed.get(&c.name))
                                .copied()
                                .unwrap_or_default()
                        })
                        .collect()
                };
                let consumes: Box<[_]> = match pool.consumes.get(&entry) {
                    Some(c) => c.as_slice().into(),
                    None => Box::default(),
                };
                let counted = !multi && consumes.iter().any(|(_, q)| *q > Quantity::ZERO);
                plain &= !multi && !counted;
                // Used devices are never interchangeable: a number no signature has.
                let sym = if usage.is_some() {
                    u32::MAX - (base + k) as u32
                } else {
                    e.sym
                };
                Dev {
                    entry,
                    pool: pi as u32,
                    multi,
                    taken: usage.is_some_and(|u| u.exclusive > 0),
                    shared: usage.is_some_and(|u| u.shares > 0 || !u.consumed.is_empty()),
                    used_capacity,
                    counted,
                    consumes,
                    sym,
                }
            }));
        }
        let ndev = devs.len();
        let mut claim_mask = std::mem::take(&mut sc.claim_mask);
        claim_mask.resize(ndev, 0);
        let mut alloc_capacity = std::mem::take(&mut sc.alloc_capacity);
        alloc_capacity.resize_with(ndev, || None);
        let mut alloc_shares = std::mem::take(&mut sc.alloc_shares);
        alloc_shares.resize(ndev, 0);
        let mut marks = std::mem::take(&mut sc.marks);
        marks.resize(ndev, 0);
        let mut chosen = std::mem::take(&mut sc.chosen);
        chosen.resize(plan.groups.len(), None);
        let mut results = std::mem::take(&mut sc.results);
        results.truncate(plan.claims.len());
        results.resize_with(plan.claims.len(), Vec::new);
        let mut reqs = std::mem::take(&mut sc.reqs);
        reqs.truncate(plan.reqs.len());
        reqs.resize_with(plan.reqs.len(), ReqRun::default);
        let mut consumed = std::mem::take(&mut sc.consumed);
        consumed.truncate(pools.len());
        consumed.resize_with(pools.len(), Vec::new);
        for (c, p) in consumed.iter_mut().zip(&pools) {
            c.clear();
            c.resize(p.available.len(), Quantity::ZERO);
        }
        let mut attr_values = std::mem::take(&mut sc.attr_values);
        attr_values.truncate(plan.claims.len());
        attr_values.resize_with(plan.claims.len(), Vec::new);
        let mut cstate = std::mem::take(&mut sc.cstate);
        cstate.truncate(plan.claims.len());
        cstate.resize_with(plan.claims.len(), Vec::new);
        for (ci, claim) in plan.claims.iter().enumerate() {
            let per_claim = &mut attr_values[ci];
            per_claim.truncate(claim.constraints.len());
            per_claim.resize_with(claim.constraints.len(), Vec::new);
            let states = &mut cstate[ci];
            states.clear();
            for (c, values) in claim.constraints.iter().zip(per_claim.iter_mut()) {
                let numa = c.attribute == NUMA_ATTRIBUTE;
                values.clear();
                values.extend(devs.iter().map(|d| {
                    if numa {
                        // Looked up once per snapshot.
                        return snap.devices[d.entry as usize]
                            .numa
                            .map(|v| snap.numa_value(v).clone());
                    }
                    let (slice, _) = snap.device(d.entry);
                    lookup(snap.maps(d.entry), &slice.spec.driver, &c.attribute)
                }));
                states.push(ConstraintState::new(c.kind));
            }
        }
        let mut compat = std::mem::take(&mut sc.compat);
        compat.extend(pools.iter().map(|p| p.compat_base.clone()));
        let mut run = NodeRun {
            compat,
            compat_undo: Vec::new(),
            derived: NumMap::default(),
            snap,
            plan,
            node,
            node_name: node.metadata.name.as_deref().unwrap_or_default(),
            limits,
            pools,
            devs,
            reqs,
            attr_values,
            claim_mask,
            alloc_capacity,
            alloc_shares,
            consumed,
            cstate,
            results,
            chosen,
            memo: NumSet::default(),
            // Derived attributes are evaluated where upstream's search reaches them (an
            // error there fails the attempt): no pruning that could skip or add one.
            faithful: plan
                .reqs
                .iter()
                .any(|r| (r.all || !r.derived.is_empty()) && !r.constraints.is_empty()),
            steps: 0,
            marks,
            epoch: 0,
            seen: std::mem::take(&mut sc.seen),
            negative: Vec::new(),
            plain,
            shares: None,
            home: Some(sc),
        };
        // The vector, not each request's entry, is taken out: an entry is 400 bytes.
        let mut reqs = std::mem::take(&mut run.reqs);
        let found = plan
            .reqs
            .iter()
            .zip(&mut reqs)
            .try_for_each(|(r, rr)| run.candidates(r, rr));
        run.reqs = reqs;
        found?;
        if plan.packing {
            run.order_for_packing();
        }
        run.prepare_bounds();
        // Per claim, the minimum number of results, now that "All" counts are known.
        for claim in &plan.claims {
            let mut min = 0usize;
            for g in claim.groups.clone() {
                let need = plan.groups[g]
                    .alts
                    .iter()
                    .map(|&a| run.count(a))
                    .min()
                    .unwrap_or(0);
                if need > MAX_RESULTS_PER_CLAIM - min {
                    return Err(AllocError::InvalidClaim {
                        claim: claim.display.clone(),
                        message: format!(
                            "request {}: adding {need} devices exceeds the claim limit of {MAX_RESULTS_PER_CLAIM}, with {min} already accounted for",
                            plan.reqs[plan.groups[g].alts[0]].base
                        ),
                    });
                }
                min += need;
            }
        }
        Ok(run)
    }

    /// Best fit: try devices of NUMA domains that are already partly used first, then of
    /// the smallest domains, so whole free domains stay free. Any order keeps the search
    /// complete; only which valid answer comes first changes.
    fn order_for_packing(&mut self) {
        let mut domains: Vec<((u32, u32), usize, bool)> = Vec::new();
        for d in &self.devs {
            let Some(n) = self.snap.devices[d.entry as usize].numa else {
                continue;
            };
            let key = (d.pool, n);
            let i = match domains.iter().position(|x| x.0 == key) {
                Some(i) => i,
                None => {
                    domains.push((key, 0, false));
                    domains.len() - 1
                }
            };
            if d.taken || d.shared {
                domains[i].2 = true;
            } else {
                domains[i].1 += 1;
            }
        }
        let rank = |d: &Dev| -> (u8, usize) {
            let Some(n) = self.snap.devices[d.entry as usize].numa else {
                return (2, 0);
            };
            match domains.iter().find(|x| x.0 == (d.pool, n)) {
                Some((_, free, true)) => (0, *free),
                Some((_, free, false)) => (1, *free),
                None => (2, 0),
            }
        };
        let ranks: Vec<(u8, usize)> = self.devs.iter().map(rank).collect();
        for rr in &mut self.reqs {
            rr.cand.sort_by_key(|&d| ranks[d as usize]);
        }
    }

    fn count(&self, r: usize) -> usize {
        let p = &self.plan.reqs[r];
        if p.all {
            self.reqs[r].all.len()
        } else {
            p.count
        }
    }

    /// (In the class, selected) from the device's own cached results alone, when they
    /// decide it: what [`NodeRun::selects`] finds for most devices once warm, without its
    /// lookups. The same order: a class selector known false decides (false, false).
    fn known_selects(&self, r: &ReqPlan, entry: u32) -> Option<(bool, bool)> {
        let e = &self.snap.devices[entry as usize];
        let all = |sels: &[crate::plan::CompiledSelector]| -> Option<bool> {
            for s in sels {
                if !e.known_selector(s.expr)? {
                    return Some(false);
                }
            }
            Some(true)
        };
        if !all(&r.class_selectors)? {
            return Some((false, false));
        }
        Some((true, all(&r.selectors)?))
    }

    fn selects(&self, r: &ReqPlan, d: &Dev) -> Result<(bool, bool), AllocError> {
        if let Some(known) = self.known_selects(r, d.entry) {
            return Ok(known);
        }
        // The device itself is read only when a result is not cached.
        let dref = || self.snap.device_ref(d.entry);
        let id = || self.snap.device_id(d.entry);
        let eval = |sels: &[crate::plan::CompiledSelector], ctx: &dyn Fn(usize) -> String| {
            for (i, s) in sels.iter().enumerate() {
                let hit = match self
                    .snap
                    .cached_selector(s.expr, d.entry, s.reads.as_deref())
                {
                    Some(b) => b,
                    None => {
                        let b = s.selector.matches(dref()).map_err(|e| AllocError::Cel {
                            context: ctx(i),
                            source: e.with_context(ctx(i)),
                        })?;
                        self.snap
                            .cache_selector(s.expr, d.entry, s.reads.as_deref(), b);
                        b
                    }
                };
                if !hit {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let class_ctx =
            |i: usize| format!("class {}: selector #{i} on device {}", r.class_name, id());
        if !eval(&r.class_selectors, &class_ctx)? {
            return Ok((false, false));
        }
        let display = &self.plan.claims[r.claim].display;
        let req_ctx = |i: usize| format!("claim {display}: selector #{i} on device {}", id());
        Ok((true, eval(&r.selectors, &req_ctx)?))
    }

    /// Fills `rr` (empty) with request `r`'s candidates on this node.
    fn candidates(&self, r: &ReqPlan, rr: &mut ReqRun) -> Result<(), AllocError> {
        let features = self.snap.features();
        let st = &mut rr.stats;
        st.needed = (!r.all).then_some(r.count);
        st.on_node = self.devs.len();
        if r.all {
            for p in &self.pools {
                match &p.state {
                    PoolState::Usable => {}
                    PoolState::Incomplete => {
                        return Err(AllocError::PoolNotReady {
                            claim: self.plan.claims[r.claim].display.clone(),
                            request: r.name.clone(),
                            pool: p.id(),
                            why: "currently being updated",
                        });
                    }
                    PoolState::Invalid(_) => {
                        return Err(AllocError::PoolNotReady {
                            claim: self.plan.claims[r.claim].display.clone(),
                            request: r.name.clone(),
                            pool: p.id(),
                            why: "currently invalid",
                        });
                    }
                }
            }
        }
        rr.cand.reserve(self.devs.len());
        for (di, d) in self.devs.iter().enumerate() {
            let di = di as u32;
            let entry = &self.snap.devices[d.entry as usize];
            if !features.binding_conditions && entry.binding_conditions {
                continue;
            }
            let (in_class, selected) = match self.selects(r, d) {
                Ok(v) => v,
                Err(e) if !r.all => {
                    // Upstream only meets this error when the search reaches the device.
                    rr.errors.insert(di, e);
                    rr.cand.push(di);
                    continue;
                }
                Err(e) => return Err(e),
            };
            st.in_class += usize::from(in_class);
            if !selected {
                continue;
            }
            st.match_selectors += 1;
            if entry.per_device {
                let (slice, device) = self.snap.device(d.entry);
                if !device_node_matches(self.node, device).map_err(|e| {
                    AllocError::InvalidSlice {
                        slice: slice.metadata.name.clone().unwrap_or_default(),
                        message: e.to_string(),
                    }
                })? {
                    st.other_node += 1;
                    continue;
                }
            }
            // DRANodeAllocatableResources off: never allocated (the mapped CPU or memory
            // would not be counted), said so.
            let maps_node_resources = !features.node_allocatable_resources && entry.node_resources;
            let node_operations =
                entry.skip_node_operations && !self.node_operations_allow(d.entry);
            let tainted = features.device_taints && taint_blocks(&entry.taints, &r.tolerations);
            // Only shared devices, and those whose capacity shares use, keep the amount.
            let keeps_amount = d.multi || !d.used_capacity.is_empty();
            // Most devices: nothing in their capacity or counters to check and no amount
            // to keep, so their parsed entry is not read.
            let parsed = (!entry.plain_parsed || r.capacity.is_some() || keeps_amount)
                .then(|| self.snap.parsed(d.entry));
            let unusable = parsed.is_some_and(|p| {
                p.broken.is_some() || (!features.partitionable_devices && !p.counters.is_empty())
            }) || node_operations
                || maps_node_resources;
            let mut need = None;
            if features.consumable_capacity
                && let Some(parsed) = parsed
            {
                let computed = match (
                    &r.capacity,
                    parsed.unrequested(features.fractional_capacity_range),
                ) {
                    // Same for every request without capacity stanza: computed once per device.
                    // Only shared devices keep the amount, so others need no copy.
                    (None, Ok(n)) => Ok(n
                        .as_ref()
                        .map(|v| if keeps_amount { v.clone() } else { Vec::new() })),
                    _ => consumption(
                        r.capacity.as_deref(),
                        &parsed.capacity,
                        features.fractional_capacity_range,
                    ),
                };
                match computed {
                    Ok(Some(n)) => need = Some(n),
                    Ok(None) => {
                        st.capacity_mismatch += 1;
                        continue;
                    }
                    Err(e) => {
                        let err = AllocError::InvalidClaim {
                            claim: self.plan.claims[r.claim].display.clone(),
                            message: format!(
                                "request {}: checking capacity for device {}: {e}",
                                r.name,
                                self.snap.device_id(d.entry)
                            ),
                        };
                        if r.all {
                            return Err(err);
                        }
                        rr.errors.insert(di, err);
                        rr.cand.push(di);
                        continue;
                    }
                }
            }
            // Only devices with capacity used by shares need the amount later; for the
            // others the static check above is the whole check.
            if let Some(n) = need.filter(|_| keeps_amount) {
                rr.need.insert(di, n);
            }
            if r.all {
                if tainted || unusable {
                    rr.blocked.insert(di);
                }
                rr.all.push(di);
            }
            if tainted {
                st.tainted += 1;
                continue;
            }
            if unusable {
                st.node_allocatable += usize::from(maps_node_resources);
                st.node_operations += usize::from(node_operations);
                continue;
            }
            if !r.all {
                rr.cand.push(di);
            }
            rr.any_multi |= d.multi;
            // Explanation counts against the state outside this attempt.
            if d.taken && !r.admin {
                st.in_use += 1;
            } else if !(d.consumes.is_empty() || d.multi && d.shared)
                && d.consumes
                    .iter()
                    .any(|(i, q)| self.pools[d.pool as usize].available[*i] < *q)
            {
                st.blocked_by_counters += 1;
            } else if !self.capacity_fits(rr.need.get(&di), di) {
                st.blocked_by_capacity += 1;
            } else {
                st.available += 1;
            }
        }
        if r.all {
            st.needed = None;
        }
        Ok(())
    }

    fn capacity_fits(&self, need: Option<&Vec<Quantity>>, d: u32) -> bool {
        let Some(need) = need else { return true };
        let dev = &self.devs[d as usize];
        let caps = &self.snap.parsed(dev.entry).capacity;
        let alloc = self.alloc_capacity[d as usize].as_ref();
        caps.iter().enumerate().all(|(i, c)| {
            let mut total = dev.used_capacity[i] + need[i];
            if let Some(a) = alloc {
                total += a[i];
            }
            total <= c.value
        })
    }

    /// Whether shared device `d` can take one more share with `need` now: capacity left, and
    /// for its first share the counters it consumes.
    fn share_fits(&self, need: Option<&Vec<Quantity>>, d: u32) -> bool {
        if !self.capacity_fits(need, d) {
            return false;
        }
        if self.capacity_in_use(d) {
            return true;
        }
        let dev = &self.devs[d as usize];
        let pool = dev.pool as usize;
        dev.consumes.iter().all(|&(k, q)| {
            self.consumed[pool][k] + q <= self.pools[pool].available[k]
                || self.negative.contains(&(dev.pool, k))
        })
    }

    /// The static part of the counter and capacity bounds, per request.
    fn prepare_bounds(&mut self) {
        if self.plain {
            return;
        }
        let any_counters = self.pools.iter().any(|p| !p.consumes.is_empty());
        let mut totals = Vec::new();
        if any_counters {
            for dev in &self.devs {
                for &(k, q) in &dev.consumes {
                    if q.is_negative() && !self.negative.contains(&(dev.pool, k)) {
                        self.negative.push((dev.pool, k));
                    }
                }
            }
            totals = self.consumed.clone();
        }
        let mut reqs = std::mem::take(&mut self.reqs);
        for (p, rr) in self.plan.reqs.iter().zip(&mut reqs) {
            if any_counters || rr.any_multi {
                self.prepare_request(p, rr, &mut totals);
            }
        }
        self.reqs = reqs;
    }

    /// `totals`: zeros shaped like `consumed`, left so.
    fn prepare_request(&self, p: &ReqPlan, rr: &mut ReqRun, totals: &mut [Vec<Quantity>]) {
        // A request with pending errors keeps the plain count (see the module comment).
        if !rr.errors.is_empty() {
            return;
        }
        let list = if p.all { &rr.all } else { &rr.cand };
        // Whether some counter can bind: the candidates together need more than there is.
        let mut shared = false;
        for &d in list {
            let dev = &self.devs[d as usize];
            shared |= dev.multi;
            if !dev.multi {
                for &(k, q) in &dev.consumes {
                    if q > Quantity::ZERO {
                        let t = &mut totals[dev.pool as usize][k];
                        *t = t.saturating_add(q);
                    }
                }
            }
        }
        let mut binds = false;
        for &d in list {
            let dev = &self.devs[d as usize];
            if !dev.multi {
                for &(k, _) in &dev.consumes {
                    let t = &mut totals[dev.pool as usize][k];
                    binds |= *t > self.pools[dev.pool as usize].available[k];
                    *t = Quantity::ZERO;
                }
            }
        }
        if !shared && !binds {
            return;
        }
        let b = &mut rr.bound;
        b.kind.clear();
        b.kind.extend(list.iter().map(|&d| {
            if self.devs[d as usize].multi {
                Kind::Shared
            } else {
                Kind::Plain
            }
        }));
        if binds {
            let members: Vec<(u32, u32, u32)> = (0..list.len() as u32)
                .filter(|&pos| self.devs[list[pos as usize] as usize].counted)
                .map(|pos| {
                    let d = list[pos as usize];
                    (pos, d, self.devs[d as usize].pool)
                })
                .collect();
            counter_groups(
                &members,
                |d| &self.devs[d as usize].consumes,
                |pool, k| self.pools[pool as usize].counter_set[k],
                |pool, k| {
                    (!self.negative.contains(&(pool, k)))
                        .then(|| self.pools[pool as usize].available[k])
                },
                false,
                &mut b.groups,
            );
            for g in &b.groups {
                for &(pos, _) in &g.members {
                    b.kind[pos as usize] = Kind::Counted;
                }
            }
        }
        b.active = shared || !b.groups.is_empty();
        if !b.active {
            b.kind.clear();
        }
    }

    /// The most devices of group `g` (of pool `pool`; its devices numbered from `offset`)
    /// for which `keep(position, device)` holds that can still be added together (see the
    /// module comment).
    fn group_bound(
        &self,
        pool: usize,
        g: &CounterGroup,
        offset: u32,
        keep: impl Fn(u32, u32) -> bool,
    ) -> usize {
        let n = g
            .members
            .iter()
            .filter(|&&(pos, d)| keep(pos, d + offset))
            .count();
        let mut best = n;
        for (k, items) in &g.counters {
            if best == 0 {
                break;
            }
            let left = self.pools[pool].available[*k] - self.consumed[pool][*k];
            let (mut sum, mut fit, mut seen, mut full) = (Quantity::ZERO, 0, 0, false);
            for &(q, pos, d) in items {
                if !keep(pos, d + offset) {
                    continue;
                }
                seen += 1;
                // Smallest first: once one does not fit, no larger one does.
                if !full {
                    if sum + q <= left {
                        sum += q;
                        fit += 1;
                    } else {
                        full = true;
                    }
                }
            }
            best = best.min(n - seen + fit);
        }
        best
    }

    /// An upper bound on how many more devices request `r` can take from its candidates at
    /// positions `start..` in the current state; counting stops at `target`.
    fn req_supply(&self, r: usize, start: usize, target: usize) -> usize {
        let p = &self.plan.reqs[r];
        let rr = &self.reqs[r];
        let list = if p.all { &rr.all } else { &rr.cand };
        let usable = |d: u32| self.usable(p.admin, p.claim, d);
        let mut have = 0;
        if !rr.bound.active {
            for &d in &list[start..] {
                if usable(d) {
                    have += 1;
                    if have >= target {
                        break;
                    }
                }
            }
            return have;
        }
        for (i, &d) in list.iter().enumerate().skip(start) {
            let counts = match rr.bound.kind[i] {
                Kind::Counted => false,
                Kind::Plain => usable(d),
                Kind::Shared => usable(d) && self.share_fits(rr.need.get(&d), d),
            };
            if counts {
                have += 1;
                if have >= target {
                    return have;
                }
            }
        }
        for g in &rr.bound.groups {
            have += self.group_bound(g.pool as usize, g, 0, |pos, d| {
                pos as usize >= start && usable(d)
            });
            if have >= target {
                break;
            }
        }
        have
    }

    /// All remaining non-admin requests from group `g` on, together: (devices or shares
    /// they need, an upper bound on what their candidates can give now, whether that bound
    /// read counters or capacity). With `stop`, counting stops once the need is met.
    fn together(&mut self, g: usize, stop: bool) -> (usize, usize, bool) {
        let plan = self.plan;
        let epoch = self.next_epoch();
        let mut demand = 0usize;
        let mut supply = 0usize;
        if self.plain {
            // Distinct free devices; with `stop`, only until they cover the demand (at the
            // root of a one-device pod, the first free device).
            let counted = |h: &usize| !plan.groups[*h].alts.iter().any(|&a| plan.reqs[a].admin);
            demand = (g..plan.groups.len())
                .filter(counted)
                .map(|h| self.group_demand(h, None))
                .sum();
            'count: for h in (g..plan.groups.len()).filter(counted) {
                for &a in &plan.groups[h].alts {
                    let rr = &self.reqs[a];
                    let list = if plan.reqs[a].all { &rr.all } else { &rr.cand };
                    for &d in list {
                        if self.marks[d as usize] != epoch && !self.in_use(d) {
                            self.marks[d as usize] = epoch;
                            supply += 1;
                            if stop && supply >= demand {
                                break 'count;
                            }
                        }
                    }
                }
            }
            return (demand, supply, false);
        }
        // Free devices that consume counters: counted by counter groups below.
        let mut counted = 0usize;
        // No request has a pending error (see the module comment).
        let mut exact = true;
        let mut any_multi = false;
        let mut shares: Option<Box<Shares>> = None;
        for h in g..plan.groups.len() {
            let alts = &plan.groups[h].alts;
            if alts.iter().any(|&a| plan.reqs[a].admin) {
                continue;
            }
            demand += self.group_demand(h, None);
            for &a in alts {
                let rr = &self.reqs[a];
                exact &= rr.errors.is_empty();
                any_multi |= rr.any_multi;
                let list = if plan.reqs[a].all { &rr.all } else { &rr.cand };
                for &d in list {
                    let di = d as usize;
                    let dev = &self.devs[di];
                    if dev.multi {
                        let need = rr.need.get(&d);
                        if !dev.taken && self.share_fits(need, d) {
                            let sh = shares.get_or_insert_with(|| {
                                let mut sh = self.shares.take().unwrap_or_default();
                                sh.uses.clear();
                                sh.needs.clear();
                                sh
                            });
                            sh.add(dev.used_capacity.len(), d, h, need);
                        }
                        continue;
                    }
                    if self.marks[di] == epoch || self.in_use(d) {
                        continue;
                    }
                    self.marks[di] = epoch;
                    if self.devs[di].counted {
                        counted += 1;
                    } else {
                        supply += 1;
                    }
                }
            }
        }
        if any_multi && !exact {
            // Pending errors and shared devices: no bound (as before the counter bounds).
            if shares.is_some() {
                self.shares = shares;
            }
            return (demand, usize::MAX, false);
        }
        if !exact {
            supply += std::mem::take(&mut counted);
        }
        let bounded = counted > 0 || shares.is_some();
        if let Some(mut sh) = shares {
            let enough = stop.then(|| demand.saturating_sub(supply));
            supply = supply.saturating_add(self.share_supply(&mut sh, enough));
            self.shares = Some(sh);
        }
        if counted > 0 && !(stop && supply >= demand) {
            // Devices are numbered pool by pool, in the order of the pools' entries.
            let mut offset = 0u32;
            'pools: for (pi, pool) in self.pools.iter().enumerate() {
                if pool.state != PoolState::Usable {
                    continue;
                }
                if !pool.consumes.is_empty() {
                    let groups = pool
                        .s
                        .counter_groups
                        .get_or_init(|| pool_counter_groups(self.snap, &pool.s));
                    for grp in groups {
                        supply += self
                            .group_bound(pi, grp, offset, |_, d| self.marks[d as usize] == epoch);
                        if stop && supply >= demand {
                            break 'pools;
                        }
                    }
                }
                offset += pool.entries.len() as u32;
            }
        }
        (demand, supply, bounded)
    }

    /// What the shared devices recorded in `sh` can give: per device, its shares (one per
    /// request) within each capacity left. Counting stops once `enough` is reached.
    fn share_supply(&self, sh: &mut Shares, enough: Option<usize>) -> usize {
        let mut supply = 0usize;
        sh.uses.sort_by_key(|s| s.dev);
        let mut fits: Vec<Quantity> = Vec::new();
        for run in sh.uses.chunk_by(|a, b| a.dev == b.dev) {
            if enough.is_some_and(|e| supply >= e) {
                break;
            }
            let di = run[0].dev as usize;
            let caps = &self.snap.parsed(self.devs[di].entry).capacity;
            let alloc = self.alloc_capacity[di].as_ref();
            let mut best = run.len();
            for (j, c) in caps.iter().enumerate() {
                let mut left = c.value - self.devs[di].used_capacity[j];
                if let Some(a) = alloc {
                    left -= a[j];
                }
                fits.clear();
                fits.extend(
                    run.iter()
                        .map(|s| sh.needs[s.off as usize + j])
                        .filter(|n| *n > Quantity::ZERO),
                );
                if fits.is_empty() {
                    continue;
                }
                fits.sort_unstable();
                let mut sum = Quantity::ZERO;
                let fit = fits
                    .iter()
                    .take_while(|n| {
                        sum += **n;
                        sum <= left
                    })
                    .count();
                best = best.min(run.len() - fits.len() + fit);
            }
            supply = supply.saturating_add(best);
        }
        supply
    }

    /// One search step, in claim `claim` (an index into the plan's claims); every 256 steps
    /// the deadline and the cancel flag are checked, and an abort names that claim.
    fn tick(&mut self, claim: usize) -> Result<(), AllocError> {
        self.steps += 1;
        if self.steps & 255 != 0 {
            return Ok(());
        }
        let expired = self
            .limits
            .deadline
            .is_some_and(|d| std::time::Instant::now() > d);
        let cancelled = self
            .limits
            .cancel
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed));
        if !(expired || cancelled) {
            return Ok(());
        }
        Err(AllocError::Aborted {
            steps: self.steps,
            why: if cancelled {
                "cancelled"
            } else {
                "deadline exceeded"
            },
            claim: self.plan.claims.get(claim).map(|c| c.display.clone()),
        })
    }

    fn in_use(&self, d: u32) -> bool {
        self.devs[d as usize].taken || self.claim_mask[d as usize] != 0
    }

    fn usable(&self, admin: bool, claim: usize, d: u32) -> bool {
        if admin {
            self.claim_mask[d as usize] & (1 << claim) == 0
        } else {
            !self.in_use(d)
        }
    }

    fn clean(&self, d: u32) -> bool {
        self.claim_mask[d as usize] == 0 && self.alloc_shares[d as usize] == 0
    }

    fn capacity_in_use(&self, d: u32) -> bool {
        self.devs[d as usize].shared || self.alloc_shares[d as usize] > 0
    }

    fn next_epoch(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.marks.iter_mut().for_each(|m| *m = 0);
            self.epoch = 1;
        }
        self.epoch
    }

    /// Runs the search; `Ok(None)` when nothing fits.
    pub(crate) fn solve(&mut self) -> Result<Option<Allocation>, AllocError> {
        if self.group(0)? {
            return Ok(Some(self.allocation()?));
        }
        Ok(None)
    }

    fn group(&mut self, g: usize) -> Result<bool, AllocError> {
        // Past the last group the search is done: no claim to name.
        let claim = self.plan.groups.get(g).map_or(usize::MAX, |x| x.claim);
        self.tick(claim)?;
        if g == self.plan.groups.len() {
            return Ok(true);
        }
        if !self.faithful && !self.bounds_hold(g) {
            return Ok(false);
        }
        // The root is visited once: nothing to remember there. While nothing has failed
        // the memo is empty: the key is needed only to remember this state if it fails
        // (the state is the same on the way out).
        let memoise = !self.faithful && g > 0;
        let mut key = None;
        if memoise && !self.memo.is_empty() {
            let k = self.memo_key(g);
            if self.memo.contains(&k) {
                return Ok(false);
            }
            key = Some(k);
        }
        let plan = self.plan;
        let group = &plan.groups[g];
        for &alt in &group.alts {
            let count = self.count(alt);
            let p = &plan.reqs[alt];
            if p.all && count == 0 {
                continue;
            }
            if count > MAX_RESULTS_PER_CLAIM - self.results[group.claim].len() {
                continue;
            }
            if self.fill(alt, 0, 0)? {
                self.chosen[g] = group.first_available.then_some(p.sub_index);
                return Ok(true);
            }
        }
        if memoise && self.memo.len() < MEMO_LIMIT {
            let k = key.unwrap_or_else(|| self.memo_key(g));
            self.memo.insert(k);
        }
        Ok(false)
    }

    fn fill(&mut self, r: usize, slot: usize, start: usize) -> Result<bool, AllocError> {
        let plan = self.plan;
        let p = &plan.reqs[r];
        let count = self.count(r);
        if slot == count {
            return self.group(p.group + 1);
        }
        self.tick(p.claim)?;
        if p.all {
            let d = self.reqs[r].all[slot];
            let Some(undo) = self.try_add(r, d, true)? else {
                return Ok(false);
            };
            if self.fill(r, slot + 1, 0)? {
                return Ok(true);
            }
            self.undo(undo);
            return Ok(false);
        }
        // Counting bound for this request.
        let needed = count - slot;
        if !self.faithful && self.req_supply(r, start, needed) < needed {
            return Ok(false);
        }
        // Symmetry classes tried at this slot: few, so kept inline.
        let mut tried = [0u32; 8];
        let mut n_tried = 0usize;
        let mut tried_more: Vec<u32> = Vec::new();
        for i in start..self.reqs[r].cand.len() {
            let d = self.reqs[r].cand[i];
            if p.admin {
                if self.claim_mask[d as usize] & (1 << p.claim) != 0 {
                    continue;
                }
            } else if self.in_use(d) {
                continue;
            }
            if let Some(e) = self.reqs[r].errors.get(&d) {
                return Err(e.clone());
            }
            if self.snap.features().consumable_capacity
                && !self.capacity_fits(self.reqs[r].need.get(&d), d)
            {
                continue;
            }
            let clean = self.clean(d);
            let sym = self.devs[d as usize].sym;
            if clean && !self.faithful {
                if tried[..n_tried].contains(&sym) || tried_more.contains(&sym) {
                    continue;
                }
                if n_tried < tried.len() {
                    tried[n_tried] = sym;
                    n_tried += 1;
                } else {
                    tried_more.push(sym);
                }
            }
            let Some(undo) = self.try_add(r, d, false)? else {
                continue;
            };
            if (self.faithful || self.match_supply_holds(r, slot + 1, i + 1))
                && self.fill(r, slot + 1, i + 1)?
            {
                return Ok(true);
            }
            self.undo(undo);
        }
        Ok(false)
    }

    fn try_add(&mut self, r: usize, d: u32, must: bool) -> Result<Option<Undo>, AllocError> {
        let plan = self.plan;
        let p = &plan.reqs[r];
        let di = d as usize;
        let multi = self.devs[di].multi;
        if !multi && p.admin && self.claim_mask[di] & (1 << p.claim) != 0 {
            return Ok(None);
        }
        if !p.admin && self.in_use(d) {
            return Ok(None);
        }
        if p.all && self.reqs[r].blocked.contains(&d) {
            return Ok(None);
        }
        let mut undo = Undo {
            req: r,
            dev: d,
            counters: false,
            compat: 0,
            constraints: 0,
            marked: false,
            capacity: false,
        };
        let skip_counters = multi && self.capacity_in_use(d);
        if !skip_counters && !self.devs[di].consumes.is_empty() {
            let pool = self.devs[di].pool as usize;
            for (i, q) in &self.devs[di].consumes {
                self.consumed[pool][*i] += *q;
            }
            let avail = &self.pools[pool].available;
            if self.consumed[pool].iter().zip(avail).any(|(c, a)| a < c) {
                for (i, q) in &self.devs[di].consumes {
                    self.consumed[pool][*i] -= *q;
                }
                return Ok(None);
            }
            undo.counters = true;
        }
        if !skip_counters && !self.join_counter_sets(d, &mut undo) {
            self.undo_partial(&undo);
            return Ok(None);
        }
        let lists = self.snap.features().list_type_attributes;
        for (n, &c) in p.constraints.iter().enumerate() {
            let derived = match self.derived_value(r, c, d) {
                Ok(v) => v,
                Err(e) => {
                    undo.constraints = n;
                    self.undo_partial(&undo);
                    return Err(e);
                }
            };
            let value = match &derived {
                Some(v) => v.as_ref(),
                None => self.attr_values[p.claim][c][di].as_ref(),
            };
            if !self.cstate[p.claim][c].add(value, lists) {
                undo.constraints = n;
                self.undo_partial(&undo);
                if must {
                    return Err(AllocError::AllConstraint {
                        claim: plan.claims[p.claim].display.clone(),
                        request: p.name.clone(),
                        device: self.snap.device_id(self.devs[di].entry).to_string(),
                    });
                }
                return Ok(None);
            }
        }
        undo.constraints = p.constraints.len();
        if !multi {
            self.claim_mask[di] |= 1 << p.claim;
            undo.marked = true;
        }
        let mut consumed = None;
        if self.snap.features().consumable_capacity {
            let need = self.reqs[r].need.get(&d).cloned();
            if !self.capacity_fits(need.as_ref(), d) {
                self.undo_partial(&undo);
                return Ok(None);
            }
            if multi {
                let need = need.unwrap_or_default();
                let slot =
                    self.alloc_capacity[di].get_or_insert_with(|| vec![Quantity::ZERO; need.len()]);
                for (s, n) in slot.iter_mut().zip(&need) {
                    *s += *n;
                }
                self.alloc_shares[di] += 1;
                undo.capacity = true;
                consumed = Some(need);
            }
        }
        self.results[p.claim].push(Pick {
            req: r,
            dev: d,
            share: multi,
            consumed,
        });
        Ok(Some(undo))
    }

    /// A device of a slice with `skipNodeOperations`: with DRAOptionalNodeOperations on,
    /// only on a node that declares the feature; off, never where the alpha allocator runs
    /// (some alpha gate on), and as any device otherwise (the stable allocator does not read
    /// the field), as upstream.
    fn node_operations_allow(&self, entry: u32) -> bool {
        let (slice, _) = self.snap.device(entry);
        if slice
            .spec
            .skip_node_operations
            .as_ref()
            .is_none_or(|s| s.is_empty())
        {
            return true;
        }
        let features = self.snap.features();
        if !features.optional_node_operations {
            return !features.alpha();
        }
        self.node
            .status
            .as_ref()
            .and_then(|s| s.declared_features.as_ref())
            .is_some_and(|f| f.iter().any(|f| f == "DRAOptionalNodeOperations"))
    }

    /// The value constraint `c` reads for device `d` in request `r` when the request derives
    /// that attribute (DRADerivedAttributes: it shadows the device's own), evaluated once
    /// per device and expression; `None` when the request does not derive it. A compile or
    /// evaluation error fails the attempt, naming the claim, request, attribute and device.
    fn derived_value(
        &mut self,
        r: usize,
        c: usize,
        d: u32,
    ) -> Result<Option<Option<AttrValue>>, AllocError> {
        let p = &self.plan.reqs[r];
        if p.derived.is_empty() {
            return Ok(None);
        }
        let attribute = &self.plan.claims[p.claim].constraints[c].attribute;
        let Some(derived) = p.derived.iter().find(|x| &x.name == attribute) else {
            return Ok(None);
        };
        let entry = self.devs[d as usize].entry;
        let key = (entry, derived.expression.clone());
        if let Some(v) = self.derived.get(&key) {
            return Ok(Some(v.clone()));
        }
        let claim = &self.plan.claims[p.claim].display;
        let context = |what: &str| {
            format!(
                "claim {claim}, request {}: {what} derived attribute {}",
                p.name, derived.name
            )
        };
        let compiled = derived.compiled.as_ref().map_err(|e| AllocError::Cel {
            context: context("compile"),
            source: e.clone(),
        })?;
        let evaluated = compiled
            .attribute(self.snap.device_ref(entry))
            .map_err(|e| AllocError::Cel {
                context: format!(
                    "{} on device {}",
                    context("evaluate"),
                    self.snap.device_id(entry)
                ),
                source: e,
            })?;
        let value = AttrValue::from_api(&evaluated);
        self.derived.insert(key, value.clone());
        Ok(Some(value))
    }

    /// DRADeviceCompatibilityGroups: the device joins each counter set it consumes if it
    /// shares a group with the devices there; false (nothing changed) if not.
    fn join_counter_sets(&mut self, d: u32, undo: &mut Undo) -> bool {
        let dev = &self.devs[d as usize];
        let pool = dev.pool as usize;
        let Some(sets) = self.pools[pool].compat.get(&dev.entry) else {
            return true;
        };
        let state = &mut self.compat[pool];
        let admits = |(set, groups): &(u32, crate::compat::Groups)| {
            state
                .get(*set as usize)
                .is_none_or(|now| now.admits(groups))
        };
        if !sets.iter().all(admits) {
            return false;
        }
        for (set, groups) in sets {
            if let Some(now) = state.get_mut(*set as usize) {
                self.compat_undo.push((pool as u32, *set, *now));
                *now = now.add(groups);
                undo.compat += 1;
            }
        }
        true
    }

    fn undo_partial(&mut self, u: &Undo) {
        let p = &self.plan.reqs[u.req];
        let di = u.dev as usize;
        for _ in 0..u.compat {
            let (pool, set, before) = self.compat_undo.pop().expect("pushed by try_add");
            self.compat[pool as usize][set as usize] = before;
        }
        if u.capacity {
            let need = self.reqs[u.req]
                .need
                .get(&u.dev)
                .cloned()
                .unwrap_or_default();
            if let Some(slot) = self.alloc_capacity[di].as_mut() {
                for (s, n) in slot.iter_mut().zip(&need) {
                    *s -= *n;
                }
            }
            self.alloc_shares[di] -= 1;
            if self.alloc_shares[di] == 0 {
                self.alloc_capacity[di] = None;
            }
        }
        if u.marked {
            self.claim_mask[di] &= !(1 << p.claim);
        }
        let lists = self.snap.features().list_type_attributes;
        for &c in p.constraints[..u.constraints].iter().rev() {
            self.cstate[p.claim][c].remove(lists);
        }
        if u.counters {
            let pool = self.devs[di].pool as usize;
            for (i, q) in &self.devs[di].consumes {
                self.consumed[pool][*i] -= *q;
            }
        }
    }

    fn undo(&mut self, u: Undo) {
        let claim = self.plan.reqs[u.req].claim;
        self.results[claim].pop();
        self.undo_partial(&u);
    }

    /// The fewest devices group `g` needs, and whether any alternative is covered by
    /// constraint `c` (None: not considered).
    fn group_demand(&self, g: usize, constraint: Option<(usize, usize)>) -> usize {
        let group = &self.plan.groups[g];
        group
            .alts
            .iter()
            .map(|&a| match constraint {
                Some((claim, c))
                    if claim == group.claim && !self.plan.reqs[a].constraints.contains(&c) =>
                {
                    0
                }
                _ => self.count(a),
            })
            .min()
            .unwrap_or(0)
    }

    /// Counting bounds at a request boundary.
    fn bounds_hold(&mut self, g: usize) -> bool {
        let plan = self.plan;
        // Each remaining request alone.
        for h in g..plan.groups.len() {
            let ok = plan.groups[h].alts.iter().any(|&a| {
                let p = &plan.reqs[a];
                let rr = &self.reqs[a];
                if p.all {
                    let n = rr.all.len();
                    return n > 0
                        && rr.all.iter().all(|&d| self.usable(p.admin, p.claim, d))
                        && (!rr.bound.active || self.req_supply(a, 0, n) >= n);
                }
                self.req_supply(a, 0, p.count) >= p.count
            });
            if !ok {
                return false;
            }
        }
        // All remaining non-admin requests together. With one group left and plain devices
        // this follows from the check above: some alternative has `count` usable candidates,
        // the group's demand is at most that, and the together bound counts the distinct
        // free candidates of all its alternatives. (Most pods: one request, checked once.)
        if self.plain && g + 1 == plan.groups.len() {
            return true;
        }
        let (demand, supply, _) = self.together(g, true);
        demand <= supply
    }

    /// After adding a device at `slot - 1` of request `r`: every matchAttribute constraint of
    /// the claim whose value is fixed must still have enough devices with that value.
    fn match_supply_holds(&mut self, r: usize, slot: usize, start: usize) -> bool {
        let plan = self.plan;
        let p = &plan.reqs[r];
        let claim = &plan.claims[p.claim];
        let lists = self.snap.features().list_type_attributes;
        for (c, cp) in claim.constraints.iter().enumerate() {
            if cp.kind != ConstraintKind::Match {
                continue;
            }
            let in_scope = p.constraints.contains(&c);
            let mut demand = if in_scope { self.count(r) - slot } else { 0 };
            for h in p.group + 1..claim.groups.end {
                demand += self.group_demand(h, Some((p.claim, c)));
            }
            if demand == 0 {
                continue;
            }
            let epoch = self.next_epoch();
            let mut supply = 0usize;
            let later = (p.group + 1..claim.groups.end)
                .flat_map(|h| plan.groups[h].alts.iter())
                .filter(|&&a| plan.reqs[a].constraints.contains(&c))
                .map(|&a| (a, 0));
            let lists_to_scan = in_scope.then_some((r, start)).into_iter().chain(later);
            for (a, from) in lists_to_scan {
                let ap = &plan.reqs[a];
                let rr = &self.reqs[a];
                if rr.any_multi {
                    return true;
                }
                let list = if ap.all { &rr.all } else { &rr.cand };
                for &d in list.iter().skip(from) {
                    let di = d as usize;
                    if self.marks[di] == epoch || !self.usable(ap.admin, ap.claim, d) {
                        continue;
                    }
                    if self.cstate[p.claim][c]
                        .admits(self.attr_values[p.claim][c][di].as_ref(), lists)
                    {
                        self.marks[di] = epoch;
                        supply += 1;
                    }
                }
            }
            if supply < demand {
                return false;
            }
        }
        true
    }

    fn memo_key(&self, g: usize) -> u128 {
        let claim = self.plan.groups[g].claim;
        let bit = 1u64 << claim;
        let mut used: Vec<(u32, bool, u32)> = Vec::new();
        let mut shares: Vec<(u32, Vec<Quantity>)> = Vec::new();
        for (d, mask) in self.claim_mask.iter().enumerate() {
            if *mask != 0 {
                used.push((self.devs[d].sym, mask & bit != 0, 0));
            }
            if let Some(a) = &self.alloc_capacity[d] {
                shares.push((d as u32, a.clone()));
            }
            if self.alloc_shares[d] > 0 {
                used.push((d as u32, false, self.alloc_shares[d]));
            }
        }
        used.sort_unstable();
        let lists = self.snap.features().list_type_attributes;
        let constraints: Vec<Vec<AttrValue>> =
            self.cstate[claim].iter().map(|c| c.key(lists)).collect();
        hash128(&(g, self.results[claim].len(), used, shares, constraints))
    }

    /// The solution, compact: [`crate::materialise::results`] builds the API objects.
    fn allocation(&mut self) -> Result<Allocation, AllocError> {
        let mut picks = Vec::with_capacity(self.results.iter().map(Vec::len).sum());
        for (ci, claim) in self.results.iter_mut().enumerate() {
            for pick in claim.iter_mut() {
                picks.push(Picked {
                    claim: ci as u32,
                    req: pick.req as u32,
                    entry: self.devs[pick.dev as usize].entry,
                    share: pick.share,
                    consumed: pick.consumed.take(),
                });
            }
        }
        let a = Allocation {
            quality: self.quality(),
            picks,
        };
        crate::materialise::check(self.snap, self.plan, &a)?;
        Ok(a)
    }

    fn quality(&self) -> Quality {
        let plan = self.plan;
        let mut q = Quality {
            ranks: self.chosen.clone(),
            ..Default::default()
        };
        for (g, group) in plan.groups.iter().enumerate() {
            if group.first_available {
                q.prioritized_score += 8u32.saturating_sub(self.chosen[g].unwrap_or(0) as u32);
            }
        }
        let mut numa = NumaDomains::new();
        for (d, dev) in self.devs.iter().enumerate() {
            let before = !dev.taken && !dev.shared;
            let after = before && self.claim_mask[d] == 0 && self.alloc_shares[d] == 0;
            q.free_devices_after += usize::from(after);
            if let Some(v) = self.snap.devices[dev.entry as usize].numa {
                let key = (dev.pool, v);
                let i = match numa.iter().position(|(k, _)| *k == key) {
                    Some(i) => i,
                    None => {
                        numa.push((key, (true, true)));
                        numa.len() - 1
                    }
                };
                numa[i].1.0 &= before;
                numa[i].1.1 &= after;
            }
        }
        for (_, (before, after)) in &numa {
            q.free_numa_domains_after += usize::from(*after);
            q.numa_domains_broken += usize::from(*before && !*after);
        }
        q
    }

    /// Why nothing fits: per-request counts plus constraint findings.
    pub(crate) fn explain(&mut self) -> Explanation {
        let plan = self.plan;
        let mut e = Explanation {
            node: self.node_name.to_string(),
            ..Default::default()
        };
        for p in &self.pools {
            match &p.state {
                PoolState::Usable => {}
                PoolState::Incomplete => e.incomplete_pools.push(p.id()),
                PoolState::Invalid(why) => e.invalid_pools.push(format!("{} ({why})", p.id())),
            }
        }
        let mut each_alone = true;
        for g in &plan.groups {
            let ok = g.alts.iter().any(|&a| {
                let s = &self.reqs[a].stats;
                let need = self.count(a);
                let alone = if plan.reqs[a].all {
                    need > 0 && s.available == need
                } else {
                    s.available >= need
                };
                if !alone {
                    return false;
                }
                let supply = self.req_supply(a, 0, need);
                if supply < need {
                    let limit = if self.reqs[a].bound.groups.is_empty() {
                        "the capacity left on shared devices allows"
                    } else {
                        "shared counters allow"
                    };
                    e.notes.push(format!(
                        "claim {}: request {}: {limit} at most {supply} of its {} available devices at once, {need} needed",
                        plan.claims[plan.reqs[a].claim].display,
                        plan.reqs[a].name,
                        s.available
                    ));
                }
                supply >= need
            });
            each_alone &= ok;
            for &a in &g.alts {
                // Names are filled in only here: the per-node hot path counts, it does not
                // allocate strings.
                let p = &plan.reqs[a];
                e.requests.push(RequestExplanation {
                    claim: plan.claims[p.claim].display.clone(),
                    request: p.name.clone(),
                    class: p.class_name.clone(),
                    ..self.reqs[a].stats.clone()
                });
            }
        }
        if !each_alone {
            return e;
        }
        for (ci, claim) in plan.claims.iter().enumerate() {
            for (c, cp) in claim.constraints.iter().enumerate() {
                let demand: usize = claim
                    .groups
                    .clone()
                    .map(|g| self.group_demand(g, Some((ci, c))))
                    .sum();
                let mut by_value: BTreeMap<String, HashSet<u32>> = BTreeMap::new();
                for g in claim.groups.clone() {
                    for &a in &plan.groups[g].alts {
                        if !plan.reqs[a].constraints.contains(&c) {
                            continue;
                        }
                        for &d in &self.reqs[a].cand {
                            if self.devs[d as usize].taken && !plan.reqs[a].admin {
                                continue;
                            }
                            if let Some(v) = &self.attr_values[ci][c][d as usize] {
                                by_value.entry(v.describe()).or_default().insert(d);
                            }
                        }
                    }
                }
                match cp.kind {
                    ConstraintKind::Match => {
                        let best = by_value.iter().max_by_key(|(_, s)| s.len());
                        let (value, n) =
                            best.map(|(v, s)| (v.as_str(), s.len())).unwrap_or(("-", 0));
                        if n < demand {
                            e.notes.push(format!(
                                "claim {}: matchAttribute {}: at most {n} free devices share one value ({value}), {demand} needed",
                                claim.display, cp.attribute
                            ));
                        }
                    }
                    ConstraintKind::Distinct => {
                        if by_value.len() < demand {
                            e.notes.push(format!(
                                "claim {}: distinctAttribute {}: {} distinct values among free devices, {demand} needed",
                                claim.display, cp.attribute, by_value.len()
                            ));
                        }
                    }
                }
            }
        }
        let (demand, supply, bounded) = self.together(0, false);
        if supply < demand {
            e.notes.push(if bounded {
                format!(
                    "each request can be met alone, but together they need {demand} devices or shares, and shared counters and capacity leave room for at most {supply}"
                )
            } else {
                format!(
                    "each request can be met alone, but together they need {demand} devices and only {supply} free devices match them"
                )
            });
        }
        if e.notes.is_empty() {
            e.notes.push(
                "each request can be met alone, but not all together (shared devices, counters, capacity or constraints)"
                    .into(),
            );
        }
        e
    }

    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }
}

impl Shares {
    /// Records that remaining request (group) `h` may take a share of shared device `d`
    /// (with `ncap` capacities) needing `need`; for another alternative of the same
    /// request, keeps the smaller need per capacity.
    fn add(&mut self, ncap: usize, d: u32, h: usize, need: Option<&Vec<Quantity>>) {
        let di = d as usize;
        if self.slot.len() <= di {
            self.slot.resize(di + 1, u32::MAX);
        }
        let i = self.slot[di] as usize;
        if i < self.uses.len() && self.uses[i].dev == d && self.uses[i].group == h as u32 {
            let off = self.uses[i].off as usize;
            let mine = &mut self.needs[off..off + ncap];
            match need {
                Some(n) if n.len() == ncap => {
                    for (m, n) in mine.iter_mut().zip(n) {
                        *m = (*m).min(*n);
                    }
                }
                _ => mine.fill(Quantity::ZERO),
            }
            return;
        }
        self.slot[di] = self.uses.len() as u32;
        self.uses.push(ShareUse {
            dev: d,
            group: h as u32,
            off: self.needs.len() as u32,
        });
        match need {
            Some(n) if n.len() == ncap => self.needs.extend_from_slice(n),
            _ => self.needs.resize(self.needs.len() + ncap, Quantity::ZERO),
        }
    }
}

/// Groups `members` ((position, device, pool) of devices that consume some counter) by pool
/// and counter set of their first counter, into `out`, with the counters that can bind. A
/// counter is left out when `limit` gives None (some device consumes a negative amount of
/// it) or when the group's members together fit in the limit (what was available before
/// the attempt): leaving a counter out only loosens the bound. Groups left without
/// counters are dropped unless `keep_all`.
fn counter_groups<'c>(
    members: &[(u32, u32, u32)],
    consumes: impl Fn(u32) -> &'c [(usize, Quantity)],
    set_of: impl Fn(u32, usize) -> u32,
    limit: impl Fn(u32, usize) -> Option<Quantity>,
    keep_all: bool,
    out: &mut Vec<CounterGroup>,
) {
    let mut keys: Vec<(u32, u32)> = Vec::new();
    for &(pos, d, pool) in members {
        let Some(&(k0, _)) = consumes(d).iter().find(|(_, q)| *q > Quantity::ZERO) else {
            continue;
        };
        let key = (pool, set_of(pool, k0));
        let gi = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                out.push(CounterGroup {
                    pool,
                    ..Default::default()
                });
                out.len() - 1
            }
        };
        out[gi].members.push((pos, d));
    }
    let mut items: Vec<(usize, Quantity, u32, u32)> = Vec::new();
    for g in out.iter_mut() {
        items.clear();
        for &(pos, d) in &g.members {
            for &(k, q) in consumes(d) {
                if q > Quantity::ZERO {
                    items.push((k, q, pos, d));
                }
            }
        }
        items.sort_unstable_by_key(|&(k, q, pos, _)| (k, q, pos));
        for run in items.chunk_by(|a, b| a.0 == b.0) {
            let k = run[0].0;
            let Some(limit) = limit(g.pool, k) else {
                continue;
            };
            let total = run
                .iter()
                .fold(Quantity::ZERO, |t, x| t.saturating_add(x.1));
            if total > limit {
                g.counters
                    .push((k, run.iter().map(|&(_, q, pos, d)| (q, pos, d)).collect()));
            }
        }
    }
    if !keep_all {
        out.retain(|g| !g.counters.is_empty());
    }
}

/// Every device of a pool that consumes counters and is not shared, by counter set, for
/// the together bound; positions and devices are indexes into the pool's entries.
fn pool_counter_groups(snap: &Snapshot, pool: &crate::snapshot::PoolStatic) -> Vec<CounterGroup> {
    let shared_on = snap.features().consumable_capacity;
    let consumes = |i: u32| {
        pool.consumes
            .get(&pool.entries[i as usize])
            .map_or(&[][..], Vec::as_slice)
    };
    let members: Vec<(u32, u32, u32)> = (0..pool.entries.len() as u32)
        .filter(|&i| {
            !(shared_on && snap.devices[pool.entries[i as usize] as usize].view.multi)
                && consumes(i).iter().any(|(_, q)| *q > Quantity::ZERO)
        })
        .map(|i| (i, i, 0))
        .collect();
    let negative: Vec<usize> = pool
        .consumes
        .values()
        .flatten()
        .filter(|(_, q)| q.is_negative())
        .map(|(k, _)| *k)
        .collect();
    let mut out = Vec::new();
    counter_groups(
        &members,
        consumes,
        |_, k| pool.counter_set[k],
        |_, k| (!negative.contains(&k)).then(|| pool.base[k]),
        true,
        &mut out,
    );
    out
}

/// Runs one attempt on a node: search, then either the allocation or the explanation.
pub(crate) fn run(
    snap: &Snapshot,
    plan: &Plan,
    node: &Node,
    limits: Limits<'_>,
) -> Result<(Outcome, u64), AllocError> {
    let mut run = NodeRun::new(snap, plan, node, limits)?;
    match run.solve()? {
        Some(a) => Ok((Outcome::Allocated(a), run.steps())),
        None => Ok((Outcome::Unfit(run.explain()), run.steps())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::build::*;
    use crate::snapshot::SnapshotInput;
    use k8s_openapi::api::resource::v1::ResourceClaim;

    const GPU: &str = "gpu.example.com";

    /// xorshift64*, seeded.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
        }
        fn range(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.below(hi - lo + 1)
        }
    }

    /// A node with partitionable GPUs (counter sets of memory, compute and four memory
    /// slices; full devices, partitions, shared devices with and without counters, plain
    /// devices; some allocated already) and claims for them; odd seeds ask for more.
    fn partitioned(seed: u64) -> (Snapshot, Vec<ResourceClaim>) {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let big = seed % 2;
        let mut slices = Vec::new();
        let mut allocations = Vec::new();
        for p in 0..rng.range(1, 2) {
            let pool = format!("pool-{p}");
            let sets = rng.range(1, 2);
            let mut counters = slice(&format!("{pool}-counters"), GPU)
                .pool(&pool, 1, 2)
                .node("n1");
            let mut devices = slice(&format!("{pool}-devices"), GPU)
                .pool(&pool, 1, 2)
                .node("n1");
            for s in 0..sets {
                let set = format!("gpu-{s}");
                let mem = rng.range(4, 8).to_string();
                let sm = rng.range(3, 7).to_string();
                counters = counters.counter_set(
                    &set,
                    &[
                        ("mem", &mem),
                        ("sm", &sm),
                        ("s0", "1"),
                        ("s1", "1"),
                        ("s2", "1"),
                        ("s3", "1"),
                    ],
                );
                for i in 0..rng.range(2, 6) {
                    let name = format!("d-{s}-{i}");
                    let mut d = device(&name);
                    if rng.below(2) == 0 {
                        d = d.int("idx", i as i64);
                    }
                    let kind = rng.below(10);
                    let multi = (7..=8).contains(&kind);
                    if kind == 0 {
                        d = d.consumes(
                            &set,
                            &[
                                ("mem", &mem),
                                ("sm", &sm),
                                ("s0", "1"),
                                ("s1", "1"),
                                ("s2", "1"),
                                ("s3", "1"),
                            ],
                        );
                    } else if kind < 9 && (!multi || rng.below(2) == 0) {
                        let start = rng.below(4) as usize;
                        let len = rng.range(1, (4 - start) as u64) as usize;
                        let names = ["s0", "s1", "s2", "s3"];
                        let m = rng.range(1, 4).to_string();
                        let c = rng.range(1, 3).to_string();
                        let mut used: Vec<(&str, &str)> = names[start..start + len]
                            .iter()
                            .map(|n| (*n, "1"))
                            .collect();
                        used.push(("mem", &m));
                        used.push(("sm", &c));
                        d = d.consumes(&set, &used);
                    }
                    if multi {
                        d = d.multi().capacity("bw", "4");
                    }
                    if rng.below(10) == 0 {
                        let mut a = allocated(&[(GPU, &pool, &name)]);
                        if multi {
                            let r = &mut a.devices.as_mut().unwrap().results.as_mut().unwrap()[0];
                            r.share_id = Some("4f1ad2b8-0f5e-4c62-9a7b-2b1e5c9d0a11".into());
                            r.consumed_capacity = Some(
                                [(
                                    "bw".to_string(),
                                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                                        rng.range(1, 3).to_string(),
                                    ),
                                )]
                                .into(),
                            );
                        }
                        allocations.push(a);
                    }
                    devices = devices.device(d);
                }
            }
            slices.push(Arc::new(counters.build().into()));
            slices.push(Arc::new(devices.build().into()));
        }
        let mut claims = Vec::new();
        for c in 0..rng.range(1, 2) {
            let mut cb = claim(&format!("c{c}"));
            for r in 0..rng.range(1, 2 + big) {
                let one = |rng: &mut Rng, name: &str| {
                    let mut rb = request(name, "gpu").count(rng.range(1, 3 + big) as i64);
                    if rng.below(10) == 0 {
                        rb = rb.all();
                    }
                    if rng.below(4) == 0 {
                        rb = rb.capacity("bw", &rng.range(1, 3).to_string());
                    }
                    rb
                };
                let rb = if rng.below(8) == 0 {
                    first_available(
                        &format!("r{r}"),
                        vec![one(&mut rng, "a"), one(&mut rng, "b")],
                    )
                } else {
                    one(&mut rng, &format!("r{r}"))
                };
                cb = cb.request(rb);
            }
            claims.push(cb.build());
        }
        let snap = Snapshot::new(SnapshotInput {
            classes: vec![class("gpu").build()],
            slices,
            allocations,
            ..Default::default()
        });
        (snap, claims)
    }

    /// What an attempt found, comparable: the picks, or None when nothing fits.
    fn found(r: Result<Option<Allocation>, AllocError>) -> Result<Option<String>, String> {
        r.map(|a| a.map(|a| format!("{:?}", a.picks)))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn counter_and_capacity_bounds_never_change_the_answer() {
        let node = node("n1").build();
        let (mut compared, mut refused, mut pruned_steps, mut faithful_steps) = (0, 0, 0, 0);
        for seed in 0..1000 {
            let (snap, claims) = partitioned(seed);
            let refs: Vec<&ResourceClaim> = claims.iter().collect();
            let Ok(plan) = Plan::new(&snap, &refs) else {
                continue;
            };
            let limits = Limits {
                deadline: Some(Instant::now() + Duration::from_secs(5)),
                cancel: None,
            };
            let Ok(mut pruned) = NodeRun::new(&snap, &plan, &node, limits) else {
                continue;
            };
            if pruned.faithful {
                continue;
            }
            let ours = found(pruned.solve());
            let mut upstream = NodeRun::new(&snap, &plan, &node, limits).unwrap();
            upstream.faithful = true;
            let theirs = found(upstream.solve());
            if theirs.as_ref().is_err_and(|e| e.contains("deadline")) {
                continue;
            }
            assert_eq!(ours, theirs, "seed {seed}");
            compared += 1;
            refused += usize::from(matches!(ours, Ok(None)));
            pruned_steps += pruned.steps;
            faithful_steps += upstream.steps;
        }
        eprintln!(
            "{compared} compared, {refused} refused; steps {pruned_steps} pruned, {faithful_steps} unpruned"
        );
        assert!(
            compared > 900 && refused > 100 && compared - refused > 100,
            "{compared} compared, {refused} refused"
        );
        assert!(
            pruned_steps < faithful_steps,
            "{pruned_steps} vs {faithful_steps}"
        );
    }
}
