//! Triton's system shared memory extension: clients register POSIX shared memory
//! objects (`shm_open` keys) as named regions, then name a region, offset and size
//! instead of sending an input's bytes, or ask for an output to be written there.
//!
//! One registry serves HTTP and gRPC. Each region is mapped once at registration
//! (read-write, shared), bounds are checked on every use, and a region that a request
//! is using cannot be unregistered until the request is done (Triton's rule). Inputs
//! are copied out of the mapping before inference, so a client rewriting its region
//! while a request runs cannot change the tensor under the engine. Error texts are
//! Triton's (its clients' tests match them).

pub(crate) use crate::codec::ShmRef;
use crate::ApiError;
use axum::http::StatusCode;
use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// A registered region's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

struct Region {
    key: String,
    offset: u64,
    byte_size: u64,
    map: MmapRaw,
}

// `MmapRaw` is Send + Sync (memmap2), so Region is too; all access goes through the
// bounds-checked copies `read` and `write`, and the raw pointer is never handed out.

/// The registered system shared memory regions.
#[derive(Default)]
pub(crate) struct SharedMemory {
    regions: Mutex<BTreeMap<String, Arc<Region>>>,
}

fn error(status: StatusCode, message: String) -> ApiError {
    ApiError::new(status, message)
}

impl SharedMemory {
    /// Maps `byte_size` bytes at `offset` of the POSIX shared memory object `key`.
    pub(crate) fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), ApiError> {
        if name.is_empty() {
            return Err(ApiError::bad_request(
                "'region name' is necessary to register system shared memory region",
            ));
        }
        let mut regions = self.regions.lock().expect("lock");
        if regions.contains_key(name) {
            return Err(error(
                StatusCode::CONFLICT,
                format!("shared memory region '{name}' already in manager"),
            ));
        }
        let fd = open(key)?;
        let file = std::fs::File::from(fd);
        let size = file
            .metadata()
            .map_err(|_| ApiError::bad_request(format!("Invalid shared memory region: '{key}'")))?
            .len();
        if byte_size == 0 || offset.checked_add(byte_size).is_none_or(|end| end > size) {
            return Err(ApiError::bad_request(format!(
                "failed to register shared memory region '{name}': invalid args (offset {offset} + byte_size {byte_size} must be within the {size} bytes of '{key}', and byte_size above 0)"
            )));
        }
        let map = MmapOptions::new()
            .offset(offset)
            .len(byte_size as usize)
            .map_raw(&file)
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "failed to register shared memory region '{name}': unable to process address space: {e}"
                ))
            })?;
        regions.insert(
            name.to_string(),
            Arc::new(Region {
                key: key.to_string(),
                offset,
                byte_size,
                map,
            }),
        );
        tracing::info!(region = %name, key = %key, offset, byte_size, "registered system shared memory");
        Ok(())
    }

    /// Unregisters `name`, or every region when `None`. Unknown names succeed (as in
    /// Triton); a region in use by a request is kept and reported.
    pub(crate) fn unregister(&self, name: Option<&str>) -> Result<(), ApiError> {
        let mut regions = self.regions.lock().expect("lock");
        let names: Vec<String> = match name {
            Some(n) => regions.keys().filter(|k| *k == n).cloned().collect(),
            None => regions.keys().cloned().collect(),
        };
        let mut busy = Vec::new();
        for n in names {
            if Arc::strong_count(&regions[&n]) > 1 {
                busy.push(n);
            } else {
                regions.remove(&n);
            }
        }
        match (name, busy.as_slice()) {
            (_, []) => Ok(()),
            (Some(n), _) => Err(ApiError::bad_request(format!(
                "Cannot unregister shared memory region '{n}', it is currently in use."
            ))),
            (None, busy) => Err(ApiError::bad_request(format!(
                "Failed to unregister the following system shared memory regions: {}",
                busy.iter().map(|n| format!("{n} ,")).collect::<String>()
            ))),
        }
    }

    /// Status of `name`, or of every region when `None`.
    pub(crate) fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, ApiError> {
        let regions = self.regions.lock().expect("lock");
        let row = |(n, r): (&String, &Arc<Region>)| RegionStatus {
            name: n.clone(),
            key: r.key.clone(),
            offset: r.offset,
            byte_size: r.byte_size,
        };
        match name {
            None => Ok(regions.iter().map(row).collect()),
            Some(n) => regions.get_key_value(n).map(|kv| vec![row(kv)]).ok_or_else(|| {
                error(
                    StatusCode::NOT_FOUND,
                    format!("Unable to find system shared memory region: '{n}'"),
                )
            }),
        }
    }

    /// The region and the byte range a reference names, bounds-checked.
    fn locate(&self, r: &ShmRef) -> Result<(Arc<Region>, usize, usize), ApiError> {
        let region = self
            .regions
            .lock()
            .expect("lock")
            .get(&r.region)
            .cloned()
            .ok_or_else(|| {
                error(
                    StatusCode::NOT_FOUND,
                    format!("Unable to find shared memory region: '{}'", r.region),
                )
            })?;
        if r.offset >= region.byte_size && !(r.offset == region.byte_size && r.byte_size == 0) {
            return Err(ApiError::bad_request(format!(
                "Invalid offset for shared memory region: '{}' (offset {} in a region of {} bytes)",
                r.region, r.offset, region.byte_size
            )));
        }
        if r.offset
            .checked_add(r.byte_size)
            .is_none_or(|end| end > region.byte_size)
        {
            return Err(ApiError::bad_request(format!(
                "Invalid offset + byte size for shared memory region: '{}' ({} + {} exceeds its {} bytes)",
                r.region, r.offset, r.byte_size, region.byte_size
            )));
        }
        Ok((region, r.offset as usize, r.byte_size as usize))
    }

    /// A copy of the bytes a reference names.
    pub(crate) fn read(&self, r: &ShmRef) -> Result<Bytes, ApiError> {
        let (region, offset, len) = self.locate(r)?;
        let mut out = vec![0u8; len];
        // SAFETY: `locate` checked offset + len against the mapping's length; the copy
        // reads bytes another process may be writing, which yields some bytes, never
        // an invalid Rust value (u8).
        unsafe { std::ptr::copy_nonoverlapping(region.map.as_ptr().add(offset), out.as_mut_ptr(), len) };
        Ok(Bytes::from(out))
    }

    /// Writes an output into the region a reference names; it must fit.
    pub(crate) fn write(&self, output: &str, r: &ShmRef, data: &[u8]) -> Result<(), ApiError> {
        let (region, offset, len) = self.locate(r)?;
        if data.len() > len {
            return Err(ApiError::bad_request(format!(
                "shared memory size specified with the request for output '{output}' ({len} bytes) should be at least {} bytes to hold the results",
                data.len()
            )));
        }
        // SAFETY: bounds checked above; the mapping is writable and shared.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), region.map.as_mut_ptr().add(offset), data.len())
        };
        Ok(())
    }

    /// Holds the regions a request names until it is dropped, so they cannot be
    /// unregistered mid-request.
    pub(crate) fn pin(&self, refs: &[&ShmRef]) -> Vec<Arc<dyn Send + Sync>> {
        let regions = self.regions.lock().expect("lock");
        refs.iter()
            .filter_map(|r| regions.get(&r.region).cloned())
            .map(|r| r as Arc<dyn Send + Sync>)
            .collect()
    }
}

/// `shm_open(key, O_RDWR)`.
fn open(key: &str) -> Result<OwnedFd, ApiError> {
    let unable = || {
        error(
            StatusCode::BAD_REQUEST,
            format!("Unable to open shared memory region: '{key}'"),
        )
    };
    if key.is_empty() {
        return Err(unable());
    }
    let c_key = CString::new(key).map_err(|_| unable())?;
    // SAFETY: a valid NUL-terminated string; the returned descriptor is owned below.
    let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("Unable to open shared memory region: '{key}' ({e})"),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A POSIX shared memory object of `len` bytes, removed on drop.
    struct Object(CString);

    impl Object {
        fn new(key: &str, len: usize) -> Object {
            let c = CString::new(key).unwrap();
            unsafe {
                let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
                assert!(fd >= 0, "shm_open");
                assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
                libc::close(fd);
            }
            Object(c)
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            unsafe { libc::shm_unlink(self.0.as_ptr()) };
        }
    }

    fn at(region: &str, offset: u64, byte_size: u64) -> ShmRef {
        ShmRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    #[test]
    fn register_write_read_unregister() {
        let key = format!("/trident_shm_test_{}", std::process::id());
        let _object = Object::new(&key, 128);
        let shm = SharedMemory::default();
        shm.register("r", &key, 0, 128).unwrap();
        let e = shm.register("r", &key, 0, 128).unwrap_err();
        assert!(
            format!("{e:?}").contains("shared memory region 'r' already in manager"),
            "{e:?}"
        );
        shm.write("OUT", &at("r", 64, 64), &[7u8; 64]).unwrap();
        assert_eq!(&shm.read(&at("r", 64, 4)).unwrap()[..], &[7, 7, 7, 7]);
        assert_eq!(&shm.read(&at("r", 0, 4)).unwrap()[..], &[0, 0, 0, 0]);

        let e = shm.read(&at("r", 128, 4)).unwrap_err();
        assert!(
            format!("{e:?}").contains("Invalid offset for shared memory region: 'r'"),
            "{e:?}"
        );
        let e = shm.read(&at("r", 100, 64)).unwrap_err();
        assert!(format!("{e:?}").contains("Invalid offset + byte size"), "{e:?}");
        let e = shm.write("OUT", &at("r", 0, 8), &[1u8; 9]).unwrap_err();
        assert!(
            format!("{e:?}").contains("(8 bytes) should be at least 9 bytes"),
            "{e:?}"
        );
        let e = shm.read(&at("nope", 0, 1)).unwrap_err();
        assert!(
            format!("{e:?}").contains("Unable to find shared memory region: 'nope'"),
            "{e:?}"
        );

        let pinned = shm.pin(&[&at("r", 0, 1)]);
        let e = shm.unregister(Some("r")).unwrap_err();
        assert!(format!("{e:?}").contains("currently in use"), "{e:?}");
        drop(pinned);
        shm.unregister(Some("r")).unwrap();
        shm.unregister(Some("r"))
            .expect("unknown names unregister as a no-op");
        assert!(shm.status(None).unwrap().is_empty());
    }

    #[test]
    fn registration_is_bounds_checked() {
        let key = format!("/trident_shm_bounds_{}", std::process::id());
        let _object = Object::new(&key, 64);
        let shm = SharedMemory::default();
        let e = shm.register("r", &key, 32, 64).unwrap_err();
        assert!(format!("{e:?}").contains("invalid args"), "{e:?}");
        let e = shm.register("r", "/trident_no_such_object", 0, 8).unwrap_err();
        assert!(
            format!("{e:?}").contains("Unable to open shared memory region"),
            "{e:?}"
        );
        shm.register("r", &key, 32, 32).unwrap();
        let status = shm.status(Some("r")).unwrap();
        assert_eq!(status[0].offset, 32);
        assert_eq!(status[0].byte_size, 32);
    }
}
