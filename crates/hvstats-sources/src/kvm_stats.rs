//! KVM's binary statistics (`KVM_GET_STATS_FD`) of a vCPU or a VM, read by name.
//!
//! The fd holds a header, an id string, one descriptor per statistic and a data block of u64s.
//! kvm-ioctls has no wrapper, so the ioctl is issued here; descriptors are parsed once and the
//! data block is read with one `pread` per refresh. The exit path looks its statistics up once
//! ([`KvmStats::stat`]) and reads the block into a buffer it keeps ([`KvmStats::read_into`]), so
//! a refresh neither hashes names nor allocates.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use zerocopy::IntoBytes;

use hvstats_host::os as sys;

/// `KVM_GET_STATS_FD` = `_IO(0xAE, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = 0xAECE;
const HEADER_SIZE: usize = 24;
const DESC_FIXED: usize = 16;
const TYPE_MASK: u32 = 0xF;
const UNIT_MASK: u32 = 0xF0;
const UNIT_SECONDS: u32 = 0x20;
const BASE_POW2: u32 = 0x100;
/// The longest statistic name KVM gives (`KVM_STATS_NAME_SIZE` is 48), with room to grow.
const MAX_NAME_SIZE: usize = 256;
/// Statistics of one vCPU or VM: 47 and 16 in Linux 6.18, with room to grow.
const MAX_DESCRIPTORS: usize = 1024;
/// Values of one statistic: KVM's largest are its 32-bucket histograms; twice that.
pub(crate) const MAX_STAT_WORDS: usize = 64;
/// The data block, at most (1,120 bytes for a vCPU in Linux 6.18).
pub(crate) const MAX_DATA_BYTES: usize = 64 << 10;
/// Where the data block may start, at most: past the header, id and descriptors.
const MAX_LAYOUT_BYTES: u64 = 1 << 20;

/// The statistics of one file, by name.
type Descs = HashMap<String, Desc>;

/// Descriptors as read, the table parsed from them, and the length of the data block they use.
type Parsed = (Vec<u8>, Arc<Descs>, usize);

/// One statistic's place and scale.
#[derive(Clone, Copy, Debug)]
struct Desc {
    /// Index of its first u64 in the data block.
    slot: usize,
    /// Number of u64 values (a histogram has one per bucket).
    size: usize,
    flags: u32,
    exponent: i16,
}

/// An open stats fd with its descriptors.
#[derive(Debug)]
pub struct KvmStats {
    file: File,
    data_offset: u64,
    data_len: usize,
    /// Shared by every open file of the same descriptors (every vCPU of a host's VMs has the
    /// same): an observer of a thousand VMs keeps two tables, not five thousand.
    descs: Arc<Descs>,
    id: String,
}

impl std::os::fd::AsFd for KvmStats {
    /// The statistics descriptor itself (to compare it with another, as `kcmp(2)` does).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The descriptors of a statistics file: equal for two files whose every statistic is at the same
/// place, of the same scale ([`KvmStats::same_layout`]), and kept alive while held.
#[derive(Clone, Debug)]
pub struct Descriptors(Arc<Descs>);

impl PartialEq for Descriptors {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// An invalid statistics file, saying what is wrong with it.
fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("KVM stats: {what}"))
}

/// Where a statistics file's header says its parts are, checked against what KVM can produce.
struct Layout {
    name_size: usize,
    num_desc: usize,
    id_offset: u64,
    desc_offset: u64,
    data_offset: u64,
}

impl Layout {
    /// The header of `file`, when its sizes and offsets are plausible and its regions apart.
    fn read(file: &File) -> io::Result<Self> {
        let mut header = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut header, 0)?;
        let word = |i: usize| {
            u32::from_le_bytes([header[i * 4], header[i * 4 + 1], header[i * 4 + 2], header[i * 4 + 3]])
        };
        let (name_size, num_desc, id_offset, desc_offset, data_offset) =
            (word(1) as usize, word(2) as usize, word(3) as u64, word(4) as u64, word(5) as u64);
        if !(1..=MAX_NAME_SIZE).contains(&name_size) || !(1..=MAX_DESCRIPTORS).contains(&num_desc) {
            return Err(bad(format!(
                "implausible header: {num_desc} statistics named in {name_size} bytes (KVM has at most \
                 {MAX_DESCRIPTORS} in {MAX_NAME_SIZE})"
            )));
        }
        let stride = DESC_FIXED + name_size;
        // The header, the id string and the descriptors lie apart, before the data block.
        let regions = [
            (0, HEADER_SIZE as u64),
            (id_offset, id_offset + name_size as u64),
            (desc_offset, desc_offset + (stride * num_desc) as u64),
        ];
        let apart = regions
            .iter()
            .enumerate()
            .all(|(i, a)| regions[i + 1..].iter().all(|b| a.1 <= b.0 || b.1 <= a.0) && a.1 <= data_offset);
        if !apart || data_offset > MAX_LAYOUT_BYTES {
            return Err(bad(format!(
                "implausible header: id at {id_offset}, descriptors at {desc_offset}, data at {data_offset}"
            )));
        }
        Ok(Self { name_size, num_desc, id_offset, desc_offset, data_offset })
    }

    /// The statistics `file`'s descriptors name, and the length of the data block they use, each
    /// statistic within what KVM can produce (at most [`MAX_STAT_WORDS`] values): the table
    /// parsed from the same descriptors before, when there is one.
    fn descriptors(&self, file: &File) -> io::Result<(Arc<Descs>, usize)> {
        let stride = DESC_FIXED + self.name_size;
        let mut raw = vec![0u8; stride * self.num_desc];
        file.read_exact_at(&mut raw, self.desc_offset)?;
        // A table is kept for the next file of the same descriptors; a few are enough (a vCPU's
        // and a VM's, of each kernel module loaded meanwhile).
        static PARSED: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());
        let mut parsed = PARSED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, descs, data_len)) = parsed.iter().find(|(r, ..)| *r == raw) {
            return Ok((descs.clone(), *data_len));
        }
        let (descs, data_len) = Self::parse_descriptors(&raw, stride, self.num_desc)?;
        let descs = Arc::new(descs);
        if parsed.len() < 8 {
            parsed.push((raw, descs.clone(), data_len));
        }
        Ok((descs, data_len))
    }

    /// The statistics the `num_desc` descriptors in `raw` (each `stride` bytes) name, and the
    /// length of the data block they use.
    fn parse_descriptors(raw: &[u8], stride: usize, num_desc: usize) -> io::Result<(Descs, usize)> {
        let bound = (num_desc * MAX_STAT_WORDS * 8).min(MAX_DATA_BYTES);
        let mut descs = HashMap::new();
        let mut data_len = 0usize;
        for d in raw.chunks_exact(stride) {
            let flags = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
            let exponent = i16::from_le_bytes([d[4], d[5]]);
            let size = u16::from_le_bytes([d[6], d[7]]) as usize;
            let offset = u32::from_le_bytes([d[8], d[9], d[10], d[11]]) as usize;
            if !offset.is_multiple_of(8) {
                return Err(bad("unaligned statistic".into()));
            }
            let end = offset.saturating_add(size * 8);
            if size > MAX_STAT_WORDS || end > bound {
                return Err(bad(format!(
                    "a statistic of {size} values at {offset} in a data block KVM keeps within {bound} bytes"
                )));
            }
            let name = String::from_utf8_lossy(&d[DESC_FIXED..]).trim_end_matches('\0').to_string();
            data_len = data_len.max(end);
            descs.insert(name, Desc { slot: offset / 8, size, flags, exponent });
        }
        Ok((descs, data_len))
    }
}

impl KvmStats {
    /// Opens the stats of the VM or vCPU behind `fd`.
    ///
    /// # Errors
    /// When the ioctl fails (the kernel lacks KVM_CAP_BINARY_STATS_FD) or the layout is not the one
    /// the kernel documents.
    pub fn open(fd: RawFd) -> io::Result<Self> {
        // SAFETY: `fd` is a VM or vCPU fd the caller holds; the ioctl takes no argument and returns
        // a new fd or -1.
        let r = sys::check(unsafe { libc::ioctl(fd, KVM_GET_STATS_FD, 0) })?;
        // SAFETY: the kernel just gave us this fd; nothing else owns it.
        let file = unsafe { File::from_raw_fd(r) };
        Self::parse(file)
    }

    /// Parses the layout of the statistics `file` holds. Nothing is allocated from a size the
    /// file gives before it is checked against what KVM can produce: the header's sizes and
    /// offsets must be plausible, its regions apart, every statistic within
    /// [`MAX_STAT_WORDS`] values and the data block within [`MAX_DATA_BYTES`].
    ///
    /// # Errors
    /// When the header, the descriptors or the id string do not parse, or claim more than KVM makes.
    pub fn parse(file: File) -> io::Result<Self> {
        let layout = Layout::read(&file)?;
        let mut id = vec![0u8; layout.name_size];
        file.read_exact_at(&mut id, layout.id_offset)?;
        let id = String::from_utf8_lossy(&id).trim_end_matches('\0').to_string();
        if !id.starts_with("kvm-") {
            return Err(bad(format!("an id {id:?} that is not KVM's")));
        }
        let (descs, data_len) = layout.descriptors(&file)?;
        Ok(Self { file, data_offset: layout.data_offset, data_len, descs, id })
    }

    /// The id string (`kvm-<pid>` or `kvm-<pid>/vcpu-<n>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The names of every statistic the kernel has, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.descs.keys().cloned().collect();
        names.sort();
        names
    }

    /// True when `other` has the same descriptors (a statistic of one name is at the same place,
    /// of the same scale, in both): what is looked up in one holds for the other.
    pub fn same_layout(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.descs, &other.descs)
    }

    /// Its descriptors, to keep what is looked up in them for other files of the same.
    pub fn descriptors(&self) -> Descriptors {
        Descriptors(self.descs.clone())
    }

    /// True when the kernel has a statistic called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.descs.contains_key(name)
    }

    /// Where statistic `name` is and how to scale it, looked up once for
    /// [`read_into`](Self::read_into); `None` when the kernel has no such statistic.
    pub fn stat(&self, name: &str) -> Option<Stat> {
        let d = self.descs.get(name)?;
        let time =
            d.flags & UNIT_MASK == UNIT_SECONDS && d.flags & BASE_POW2 == 0 && d.flags & TYPE_MASK <= 2;
        let exp = d.exponent as i32 + 9;
        // As `nanoseconds`: beyond 10^19 a nonzero value saturates, below 10^-19 it is 0.
        let scale = if !time || exp < -19 {
            Scale::NotTime
        } else if exp > 19 {
            Scale::Mul(u64::MAX)
        } else if exp >= 0 {
            Scale::Mul(10u64.pow(exp as u32))
        } else {
            Scale::Div(10u64.pow((-exp) as u32))
        };
        Some(Stat { slot: d.slot, size: d.size, scale })
    }

    /// Words of the data block ([`read_into`](Self::read_into) needs a buffer this long).
    pub fn data_words(&self) -> usize {
        self.data_len.div_ceil(8)
    }

    /// Where the data block is in the file, and its length, in bytes: what
    /// [`read_into`](Self::read_into) reads, for a reader that reads it otherwise.
    pub fn data_block(&self) -> (u64, usize) {
        (self.data_offset, self.data_len)
    }

    /// Reads the data block into `data` (at least [`data_words`](Self::data_words) long) with
    /// one `pread`.
    ///
    /// # Errors
    /// When the pread fails or `data` is too short.
    pub fn read_into(&self, data: &mut [u64]) -> io::Result<()> {
        self.read_words_into(data, 0..self.data_words())
    }

    /// Reads words `words` of the data block (those of the statistics a reader uses, see
    /// [`Stat::words`]) into the same places of `data` (at least [`data_words`](Self::data_words)
    /// long) with one `pread` of just those bytes; the other words of `data` are left as they
    /// are. An empty range reads nothing.
    ///
    /// # Errors
    /// When the pread fails, or `data` is too short or `words` past the block.
    pub fn read_words_into(&self, data: &mut [u64], words: std::ops::Range<usize>) -> io::Result<()> {
        if data.len() < self.data_words() || words.end > self.data_words() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let Some(data) = data.get_mut(words.clone()).filter(|d| !d.is_empty()) else { return Ok(()) };
        // The last word may be cut short: the block ends where its last statistic does.
        let len = (words.end * 8).min(self.data_len) - words.start * 8;
        let offset = self.data_offset + words.start as u64 * 8;
        self.file.read_exact_at(&mut data.as_mut_bytes()[..len], offset)?;
        for v in data.iter_mut() {
            *v = u64::from_le(*v);
        }
        Ok(())
    }

    /// Reads the data block once.
    ///
    /// # Errors
    /// When the pread fails.
    pub fn snapshot(&self) -> io::Result<StatsSnapshot<'_>> {
        let mut bytes = vec![0u8; self.data_len];
        self.file.read_exact_at(&mut bytes, self.data_offset)?;
        let data =
            bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        Ok(StatsSnapshot { stats: self, data })
    }
}

/// How a statistic's value becomes nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scale {
    /// Not a time in seconds with a decimal exponent.
    NotTime,
    /// Multiply by this.
    Mul(u64),
    /// Divide by this.
    Div(u64),
}

/// A statistic looked up once ([`KvmStats::stat`]): its place in the data block and its scale.
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    slot: usize,
    size: usize,
    scale: Scale,
}

impl Stat {
    /// All its values (the buckets of a histogram) in a data block read by
    /// [`KvmStats::read_into`]; as many as the block holds.
    pub fn values(self, data: &[u64]) -> &[u64] {
        let start = self.slot.min(data.len());
        &data[start..self.slot.saturating_add(self.size).min(data.len())]
    }

    /// True for a time in seconds with a decimal exponent ([`nanoseconds`](Self::nanoseconds)
    /// converts it).
    pub fn is_time(self) -> bool {
        self.scale != Scale::NotTime
    }

    /// The words of the data block its values are in (for [`KvmStats::read_words_into`]).
    pub fn words(self) -> std::ops::Range<usize> {
        self.slot..self.slot.saturating_add(self.size)
    }

    /// True for a histogram (several values, its buckets), false for a single value.
    pub fn is_histogram(self) -> bool {
        self.size > 1
    }

    /// Its raw (first) value in a data block read by [`KvmStats::read_into`].
    pub fn raw(self, data: &[u64]) -> u64 {
        data.get(self.slot).copied().unwrap_or(0)
    }

    /// Its value in nanoseconds, or 0 when it is not a time.
    pub fn nanoseconds(self, data: &[u64]) -> u64 {
        match self.scale {
            Scale::NotTime => 0,
            Scale::Mul(m) => self.raw(data).saturating_mul(m),
            Scale::Div(d) => self.raw(data) / d,
        }
    }
}

/// The statistics at one moment.
#[derive(Debug)]
pub struct StatsSnapshot<'a> {
    stats: &'a KvmStats,
    data: Vec<u64>,
}

impl StatsSnapshot<'_> {
    /// The raw (first) value of `name`, or 0 when the kernel has no such statistic.
    pub fn raw(&self, name: &str) -> u64 {
        self.stats.descs.get(name).and_then(|d| self.data.get(d.slot)).copied().unwrap_or(0)
    }

    /// Every value of `name` (a histogram's buckets), empty when the kernel has no such statistic.
    pub fn values(&self, name: &str) -> &[u64] {
        let Some(d) = self.stats.descs.get(name) else { return &[] };
        let start = d.slot.min(self.data.len());
        &self.data[start..d.slot.saturating_add(d.size).min(self.data.len())]
    }

    /// The value of a time statistic in nanoseconds, or 0 when it is missing or not a time.
    pub fn nanoseconds(&self, name: &str) -> u64 {
        let Some(d) = self.stats.descs.get(name) else { return 0 };
        if d.flags & UNIT_MASK != UNIT_SECONDS || d.flags & BASE_POW2 != 0 || d.flags & TYPE_MASK > 2 {
            return 0;
        }
        let raw = self.raw(name) as u128;
        let exp = d.exponent as i32 + 9;
        let v = if exp >= 0 { raw * 10u128.pow(exp as u32) } else { raw / 10u128.pow((-exp) as u32) };
        v.min(u64::MAX as u128) as u64
    }
}

/// Reads the stats of `fd` (an owner's helper for tests and the CLI).
///
/// # Errors
/// As [`KvmStats::open`].
pub fn open_for(fd: &impl AsRawFd) -> io::Result<KvmStats> {
    KvmStats::open(fd.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memfd holding a header of `words` (name_size, num_desc, id_offset, desc_offset,
    /// data_offset), the id `kvm-1/vcpu-0` and one descriptor per `(size, offset)`, sized
    /// `file_size` (sparse).
    fn crafted(words: [u32; 5], descs: &[(u16, u32)], file_size: u64) -> File {
        use std::io::Write;
        let [name_size, _, id_offset, desc_offset, _] = words.map(|w| w as usize);
        // SAFETY: a literal name and no flags; the result is checked before it is owned.
        let fd = sys::check(unsafe { libc::memfd_create(c"crafted".as_ptr(), 0) }).unwrap();
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.set_len(file_size).unwrap();
        let header: Vec<u8> = [0].iter().chain(&words).flat_map(|w| w.to_le_bytes()).collect();
        file.write_all(&header).unwrap();
        let mut id = b"kvm-1/vcpu-0".to_vec();
        id.resize(name_size.min(4096), 0);
        file.write_all_at(&id, id_offset as u64).unwrap();
        for (i, &(size, offset)) in descs.iter().enumerate() {
            let mut d = vec![0u8; DESC_FIXED + name_size.min(4096)];
            d[6..8].copy_from_slice(&size.to_le_bytes());
            d[8..12].copy_from_slice(&offset.to_le_bytes());
            let name = format!("s{i}");
            let n = name.len().min(d.len() - DESC_FIXED);
            d[DESC_FIXED..DESC_FIXED + n].copy_from_slice(&name.as_bytes()[..n]);
            file.write_all_at(&d, (desc_offset + i * d.len()) as u64).unwrap();
        }
        file
    }

    fn refusal(file: File) -> String {
        KvmStats::parse(file)
            .map(|s| format!("accepted, {} words", s.data_words()))
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn a_header_claiming_more_than_kvm_makes_is_refused_before_anything_is_allocated() {
        // As KVM lays it out: 48-byte names, two statistics, the second a 32-bucket histogram.
        let good = crafted([48, 2, 24, 72, 200], &[(1, 0), (32, 8)], 4096);
        assert_eq!(refusal(good), "accepted, 33 words");
        // A statistic 4 GiB into the data block (what a crafted file behind a stats descriptor
        // claimed), one of 65,535 values, a block past 64 KiB from many small statistics.
        let far = crafted([48, 1, 24, 72, 136], &[(1, 0xFFFF_FFF8)], 4096);
        assert!(refusal(far).contains("a statistic of 1 values at 4294967288"), "refused");
        let wide = crafted([48, 1, 24, 72, 136], &[(0xFFFF, 0)], 4096);
        assert!(refusal(wide).contains("a statistic of 65535 values"));
        let descs: Vec<(u16, u32)> = (0..1024).map(|i| (64, i * 512)).collect();
        let many = crafted([48, 1024, 24, 72, 72 + 64 * 1024], &descs, 1 << 20);
        assert!(refusal(many).contains("within 65536 bytes"));
        // Sizes in the header: names of 4 KiB, 100,000 descriptors, none at all.
        for words in
            [[4096, 1, 24, 72, 8192], [48, 100_000, 24, 72, 200], [48, 0, 24, 72, 200], [0, 1, 24, 72, 200]]
        {
            assert!(refusal(crafted(words, &[], 8192)).contains("implausible header"), "{words:?}");
        }
        // Regions that overlap the header or each other, or data placed past 1 MiB.
        for words in
            [[48, 1, 0, 72, 200], [48, 1, 24, 40, 200], [48, 1, 24, 72, 100], [48, 1, 24, 72, 1 << 30]]
        {
            assert!(refusal(crafted(words, &[(1, 0)], 8192)).contains("implausible header"), "{words:?}");
        }
        // An id that is not KVM's.
        let other = crafted([48, 1, 24, 72, 136], &[(1, 0)], 4096);
        other.write_all_at(b"not-kvm\0", 24).unwrap();
        assert!(refusal(other).contains("that is not KVM's"));
    }

    #[test]
    fn looked_up_statistics_agree_with_a_snapshot() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            assert!(
                std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"),
                "/dev/kvm is required (HVSTATS_REQUIRE_KVM=1)"
            );
            eprintln!("skipping: /dev/kvm is not available");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let stats = open_for(&vcpu).unwrap();
        let mut data = vec![0u64; stats.data_words()];
        stats.read_into(&mut data).unwrap();
        let snap = stats.snapshot().unwrap();
        for name in ["halt_exits", "halt_wait_ns", "irq_exits", "insn_emulation", "pf_taken"] {
            let stat = stats.stat(name).unwrap();
            assert_eq!(stat.raw(&data), snap.raw(name), "{name}");
            assert_eq!(stat.nanoseconds(&data), snap.nanoseconds(name), "{name}");
        }
        assert!(stats.stat("no_such_statistic").is_none());
        // Reading only the words of some statistics gives each the value a full read gives.
        let used = ["halt_exits", "irq_exits", "halt_wait_hist"].map(|n| stats.stat(n).unwrap());
        let words =
            used.iter().map(|s| s.words()).reduce(|a, b| a.start.min(b.start)..a.end.max(b.end)).unwrap();
        assert!(words.len() < stats.data_words(), "{words:?} of {}", stats.data_words());
        let mut part = vec![0u64; stats.data_words()];
        stats.read_words_into(&mut part, words.clone()).unwrap();
        stats.read_into(&mut data).unwrap();
        for stat in used {
            assert_eq!(stat.values(&part), stat.values(&data), "{:?}", stat.words());
        }
        assert!(part[..words.start].iter().chain(&part[words.end..]).all(|&w| w == 0), "nothing else read");
        assert!(stats.read_words_into(&mut part, 0..stats.data_words() + 1).is_err());
        assert!(stats.read_into(&mut data[..stats.data_words() - 1]).is_err());
        // Another vCPU's statistics share the first's table of descriptors, and read its own.
        let other_vcpu = vm.create_vcpu(1).unwrap();
        let other = open_for(&other_vcpu).unwrap();
        assert!(stats.same_layout(&other), "one table for the same descriptors");
        assert_eq!(other.id(), format!("{}/vcpu-1", stats.id().split('/').next().unwrap()));
        let mut theirs = vec![0u64; other.data_words()];
        other.read_into(&mut theirs).unwrap();
        let snap = other.snapshot().unwrap();
        for name in ["halt_exits", "halt_wait_ns", "irq_exits", "insn_emulation", "pf_taken"] {
            assert_eq!(other.stat(name).unwrap().raw(&theirs), snap.raw(name), "{name}");
        }
    }

    #[test]
    fn files_of_other_descriptors_get_tables_of_their_own() {
        let one = KvmStats::parse(crafted([48, 2, 24, 72, 200], &[(1, 0), (32, 8)], 4096)).unwrap();
        let same = KvmStats::parse(crafted([48, 2, 24, 72, 200], &[(1, 0), (32, 8)], 4096)).unwrap();
        let other = KvmStats::parse(crafted([48, 2, 24, 72, 200], &[(1, 0), (16, 8)], 4096)).unwrap();
        assert!(one.same_layout(&same));
        assert!(!one.same_layout(&other));
        assert_eq!((one.data_words(), other.data_words()), (33, 17));
    }
}
