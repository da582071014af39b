//! A hypervisor instance: the hypervisor object, its LPs, and its partitions with their VPs,
//! each with a stats page.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{hypervisor, partition};

use crate::page::SharedPage;

/// The stats objects of one partition: its page and one page per VP.
#[derive(Debug)]
pub struct PartitionStats {
    id: u64,
    page: SharedPage,
    vps: Vec<SharedPage>,
}

impl PartitionStats {
    /// The partition id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The partition's page.
    pub fn page(&self) -> &SharedPage {
        &self.page
    }

    /// The page of VP `index`.
    pub fn vp_page(&self, index: u32) -> Option<&SharedPage> {
        self.vps.get(index as usize)
    }

    /// Number of VPs.
    pub fn vp_count(&self) -> u32 {
        self.vps.len() as u32
    }
}

/// One hypervisor instance: the root partition's view of every object.
#[derive(Debug)]
pub struct Hypervisor {
    page: SharedPage,
    partitions: Mutex<BTreeMap<u64, Arc<PartitionStats>>>,
    next_id: Mutex<u64>,
}

impl Hypervisor {
    /// A new instance with no partitions.
    ///
    /// # Errors
    /// When a page cannot be created.
    pub fn new() -> io::Result<Arc<Self>> {
        let page = SharedPage::anonymous(ObjectKind::Hypervisor)?;
        Ok(Arc::new(Self { page, partitions: Mutex::new(BTreeMap::new()), next_id: Mutex::new(1) }))
    }

    /// The hypervisor page.
    pub fn page(&self) -> &SharedPage {
        &self.page
    }

    /// Creates the stats objects of a new partition with `vp_count` VPs.
    ///
    /// # Errors
    /// When a page cannot be created.
    pub fn create_partition(&self, vp_count: u32) -> io::Result<Arc<PartitionStats>> {
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            let id = *next;
            *next += 1;
            id
        };
        let page = SharedPage::anonymous(ObjectKind::Partition)?;
        let vps =
            (0..vp_count).map(|_| SharedPage::anonymous(ObjectKind::Vp)).collect::<io::Result<Vec<_>>>()?;
        page.set(partition::VIRTUAL_PROCESSORS, vp_count as u64);
        let stats = Arc::new(PartitionStats { id, page, vps });
        let mut partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        partitions.insert(id, stats.clone());
        self.page.set(hypervisor::PARTITIONS, partitions.len() as u64);
        self.page.set(hypervisor::VIRTUAL_PROCESSORS, partitions.values().map(|p| p.vp_count() as u64).sum());
        Ok(stats)
    }

    /// Removes partition `id`'s objects.
    pub fn remove_partition(&self, id: u64) {
        let mut partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        partitions.remove(&id);
        self.page.set(hypervisor::PARTITIONS, partitions.len() as u64);
        self.page.set(hypervisor::VIRTUAL_PROCESSORS, partitions.values().map(|p| p.vp_count() as u64).sum());
    }

    /// The partition with `id`.
    pub fn partition(&self, id: u64) -> Option<Arc<PartitionStats>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }
}
