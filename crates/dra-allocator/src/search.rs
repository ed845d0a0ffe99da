//! The search for one node: candidate devices per request (static checks and selectors,
//! cached), then a complete depth-first search in upstream order (claims, requests,
//! subrequests, pools by driver/name, slices by name, devices in slice order; combinations,
//! not permutations), with pruning that never changes which solution is found first:
//!
//! * counting bounds: a request cannot be met with fewer usable candidates than it needs,
//!   and all remaining requests together cannot take more devices than their candidates hold;
//! * matchAttribute supply: once a constraint's value is fixed, the devices still needed by
//!   the requests it covers must exist with that value;
//! * symmetry: a device identical to one that already failed at the same step (same
//!   attributes, capacity, counters, taints, placement; unused) is not tried again;
//! * memoisation of failed states at request boundaries, keyed up to symmetry.

use std::collections::{BTreeMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceTaint, DeviceToleration};

use crate::attr::{AttrValue, ConstraintState, lookup};
use crate::capacity::consumption;
use crate::error::AllocError;
use crate::fxhash::{FxMap, FxSet};
use crate::outcome::{
    Allocation, Explanation, Limits, Outcome, Picked, Quality, RequestExplanation,
};
use crate::plan::{ConstraintKind, MAX_RESULTS_PER_CLAIM, Plan, ReqPlan};
use crate::quantity::Quantity;
use crate::snapshot::{NUMA_ATTRIBUTE, PoolInfo, PoolState, Snapshot, device_node_matches};

const MEMO_LIMIT: usize = 1 << 20;

static EMPTY_ATTRS: BTreeMap<String, DeviceAttribute> = BTreeMap::new();
static EMPTY_CAPS: BTreeMap<String, k8s_openapi::api::resource::v1::DeviceCapacity> =
    BTreeMap::new();

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
    used_capacity: Vec<Quantity>,
    /// (pool counter index, amount).
    consumes: Vec<(usize, Quantity)>,
    sym: u32,
}

#[derive(Default)]
struct ReqRun {
    /// Candidate devices for ExactCount, in search order.
    cand: Vec<u32>,
    /// For All: every matching device, all of which must be allocatable.
    all: Vec<u32>,
    /// Devices in `all` that can never be taken (taint, feature off, broken).
    blocked: FxSet<u32>,
    /// Errors found for a device, raised only if the search reaches it (as upstream).
    errors: FxMap<u32, AllocError>,
    /// Capacity consumption per device (aligned with its capacities), for feasible devices.
    need: FxMap<u32, Vec<Quantity>>,
    /// Whether any candidate may be shared (allowMultipleAllocations): unbounded supply.
    any_multi: bool,
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
    cstate: Vec<Vec<ConstraintState>>,
    results: Vec<Vec<Pick>>,
    chosen: Vec<Option<usize>>,
    memo: FxSet<u128>,
    /// Search exactly like upstream, without pruning: set when an `All` request is covered
    /// by a constraint, where upstream reports a constraint clash as an error for the whole
    /// attempt only if its search reaches it, and pruning could skip that point.
    faithful: bool,
    steps: u64,
    marks: Vec<u32>,
    epoch: u32,
    /// Kept for [`Snapshot::gather_pools`] of the next attempt.
    seen: Vec<(u32, i64, u32)>,
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
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
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
        let sc = Scratch {
            attr_values,
            pools: emptied(&mut self.pools),
            seen: emptied(&mut self.seen),
            devs: emptied(&mut self.devs),
            claim_mask: emptied(&mut self.claim_mask),
            alloc_capacity: emptied(&mut self.alloc_capacity),
            alloc_shares: emptied(&mut self.alloc_shares),
            marks: emptied(&mut self.marks),
            chosen: emptied(&mut self.chosen),
            consumed: std::mem::take(&mut self.consumed),
            cstate: std::mem::take(&mut self.cstate),
            reqs,
            results,
        };
        // Nothing to keep if the thread is going away.
        let _ = SCRATCH.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                *s = sc;
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
        let mut sc = SCRATCH
            .try_with(|s| s.try_borrow_mut().map(|mut s| std::mem::take(&mut *s)).ok())
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
        devs.reserve(ndev);
        for (pi, pool) in pools.iter().enumerate() {
            if pool.state != PoolState::Usable {
                continue;
            }
            for &entry in &pool.entries {
                let e = &snap.devices[entry as usize];
                let usage = snap.entry_usage(entry);
                let multi = features.consumable_capacity && e.view.multi;
                // Only shared devices track capacity across allocations.
                let used_capacity = if !multi {
                    Vec::new()
                } else {
                    e.capacity
                        .iter()
                        .map(|c| {
                            usage
                                .and_then(|u| u.consumed.get(&c.name))
                                .copied()
                                .unwrap_or_default()
                        })
                        .collect()
                };
                let consumes = if pool.consumes.is_empty() {
                    Vec::new()
                } else {
                    pool.consumes.get(&entry).cloned().unwrap_or_default()
                };
                // Used devices are never interchangeable: a number no signature has.
                let sym = if usage.is_some() {
                    u32::MAX - devs.len() as u32
                } else {
                    e.sym
                };
                devs.push(Dev {
                    entry,
                    pool: pi as u32,
                    multi,
                    taken: usage.is_some_and(|u| u.exclusive > 0),
                    shared: usage.is_some_and(|u| u.shares > 0 || !u.consumed.is_empty()),
                    used_capacity,
                    consumes,
                    sym,
                });
            }
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
                    let (slice, device) = snap.device(d.entry);
                    lookup(device.attributes.as_ref(), &slice.spec.driver, &c.attribute)
                }));
                states.push(ConstraintState::new(c.kind));
            }
        }
        let mut run = NodeRun {
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
            memo: FxSet::default(),
            faithful: plan.reqs.iter().any(|r| r.all && !r.constraints.is_empty()),
            steps: 0,
            marks,
            epoch: 0,
            seen: std::mem::take(&mut sc.seen),
        };
        for r in 0..plan.reqs.len() {
            let mut rr = std::mem::take(&mut run.reqs[r]);
            run.candidates(&plan.reqs[r], &mut rr)?;
            run.reqs[r] = rr;
        }
        if plan.packing {
            run.order_for_packing();
        }
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

    fn selects(&self, r: &ReqPlan, d: &Dev) -> Result<(bool, bool), AllocError> {
        // The device itself is read only when a result is not cached.
        let dref = || {
            let (slice, device) = self.snap.device(d.entry);
            dra_cel::DeviceRef {
                driver: &slice.spec.driver,
                attributes: device.attributes.as_ref().unwrap_or(&EMPTY_ATTRS),
                capacity: device.capacity.as_ref().unwrap_or(&EMPTY_CAPS),
                allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
            }
        };
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
            let tainted = features.device_taints && taint_blocks(&entry.taints, &r.tolerations);
            let unusable = entry.broken.is_some()
                || (!features.partitionable_devices && !entry.counters.is_empty());
            let mut need = None;
            if features.consumable_capacity {
                let computed = match (&r.capacity, &entry.unrequested) {
                    // Same for every request without capacity stanza: computed once per device.
                    // Only shared devices keep the amount, so others need no copy.
                    (None, Ok(n)) => Ok(n
                        .as_ref()
                        .map(|v| if d.multi { v.clone() } else { Vec::new() })),
                    _ => consumption(
                        r.capacity.as_deref(),
                        &entry.capacity,
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
            // Only shared devices need the amount later; for the others the static check
            // above is the whole check.
            if let Some(n) = need.filter(|_| d.multi) {
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
        let caps = &self.snap.devices[dev.entry as usize].capacity;
        let alloc = self.alloc_capacity[d as usize].as_ref();
        caps.iter().enumerate().all(|(i, c)| {
            let mut total = dev.used_capacity[i] + need[i];
            if let Some(a) = alloc {
                total += a[i];
            }
            total <= c.value
        })
    }

    fn tick(&mut self) -> Result<(), AllocError> {
        self.steps += 1;
        if self.steps & 255 == 0 {
            if let Some(d) = self.limits.deadline
                && std::time::Instant::now() > d
            {
                return Err(AllocError::Aborted {
                    steps: self.steps,
                    why: "deadline exceeded",
                });
            }
            if let Some(c) = self.limits.cancel
                && c.load(std::sync::atomic::Ordering::Relaxed)
            {
                return Err(AllocError::Aborted {
                    steps: self.steps,
                    why: "cancelled",
                });
            }
        }
        Ok(())
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
        self.tick()?;
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
        self.tick()?;
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
        let mut have = 0;
        for i in start..self.reqs[r].cand.len() {
            if self.usable(p.admin, p.claim, self.reqs[r].cand[i]) {
                have += 1;
                if have >= needed {
                    break;
                }
            }
        }
        if have < needed && !self.faithful {
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
        let lists = self.snap.features().list_type_attributes;
        for (n, &c) in p.constraints.iter().enumerate() {
            let value = self.attr_values[p.claim][c][di].as_ref();
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

    fn undo_partial(&mut self, u: &Undo) {
        let p = &self.plan.reqs[u.req];
        let di = u.dev as usize;
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
                    return !rr.all.is_empty()
                        && rr.all.iter().all(|&d| self.usable(p.admin, p.claim, d));
                }
                let mut have = 0;
                for &d in &rr.cand {
                    if self.usable(p.admin, p.claim, d) {
                        have += 1;
                        if have >= p.count {
                            return true;
                        }
                    }
                }
                false
            });
            if !ok {
                return false;
            }
        }
        // All remaining non-admin requests together.
        let epoch = self.next_epoch();
        let mut demand = 0usize;
        let mut supply = 0usize;
        for h in g..plan.groups.len() {
            let alts = &plan.groups[h].alts;
            if alts.iter().any(|&a| plan.reqs[a].admin) {
                continue;
            }
            demand += self.group_demand(h, None);
            for &a in alts {
                if self.reqs[a].any_multi {
                    return true;
                }
                let rr = &self.reqs[a];
                let list = if plan.reqs[a].all { &rr.all } else { &rr.cand };
                for &d in list {
                    if self.marks[d as usize] != epoch && !self.in_use(d) {
                        self.marks[d as usize] = epoch;
                        supply += 1;
                    }
                }
            }
        }
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
        // ((pool, NUMA value), (all free before, all free after)).
        let mut numa: Vec<((u32, u32), (bool, bool))> = Vec::new();
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
    pub(crate) fn explain(&self) -> Explanation {
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
                if plan.reqs[a].all {
                    need > 0 && s.available == need
                } else {
                    s.available >= need
                }
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
