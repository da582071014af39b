//! `HV_STATUS`: the 16-bit result of a hypercall.
//!
//! One table gives each value its constant, its name and its message. Success is a status value,
//! not an error; an unknown value still round-trips.

use core::fmt;
use core::num::NonZeroU16;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `HV_STATUS` (open enum).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct HvStatus(pub u16);

macro_rules! hv_statuses {
    (
        SUCCESS = $success:literal, $success_message:literal;
        $($name:ident = $value:literal, $message:literal;)*
    ) => {
        impl HvStatus {
            #[doc = $success_message]
            pub const SUCCESS: Self = Self($success);
            $(
                #[doc = $message]
                pub const $name: Self = Self($value);
            )*

            /// Every status value hvstats knows, in numeric order.
            pub const KNOWN: &'static [HvStatus] = &[Self::SUCCESS, $(Self::$name),*];

            /// The TLFS name of this status (`HV_STATUS_…`), if known.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $success => Some("HV_STATUS_SUCCESS"),
                    $($value => Some(concat!("HV_STATUS_", stringify!($name))),)*
                    _ => None,
                }
            }

            /// A one-line description of this status, if known.
            pub const fn message(self) -> Option<&'static str> {
                match self.0 {
                    $success => Some($success_message),
                    $($value => Some($message),)*
                    _ => None,
                }
            }
        }

        impl HvError {
            $(
                #[doc = $message]
                pub const $name: Self = Self::known($value);
            )*
        }
    };
}

hv_statuses! {
    SUCCESS = 0x0000, "The operation succeeded.";
    INVALID_HYPERCALL_CODE = 0x0002, "The hypercall code is not recognized.";
    INVALID_HYPERCALL_INPUT = 0x0003, "The hypercall input value is malformed.";
    INVALID_ALIGNMENT = 0x0004, "A GPA is misaligned or an input block crosses a page.";
    INVALID_PARAMETER = 0x0005, "A parameter of the hypercall is invalid.";
    ACCESS_DENIED = 0x0006, "The caller lacks the privilege for the operation.";
    INVALID_PARTITION_STATE = 0x0007, "The partition is not in a state that permits the operation.";
    OPERATION_DENIED = 0x0008, "The operation is not permitted in the current state.";
    UNKNOWN_PROPERTY = 0x0009, "The property is not recognized.";
    PROPERTY_VALUE_OUT_OF_RANGE = 0x000A, "The property value is out of range.";
    INSUFFICIENT_MEMORY = 0x000B, "The caller's memory pool is insufficient.";
    PARTITION_TOO_DEEP = 0x000C, "The partition hierarchy is too deep.";
    INVALID_PARTITION_ID = 0x000D, "The partition id does not name a partition.";
    INVALID_VP_INDEX = 0x000E, "The VP index does not name a virtual processor of the partition.";
    NOT_FOUND = 0x0010, "The object was not found.";
    INSUFFICIENT_BUFFERS = 0x0013, "Not enough buffers are available.";
    OBJECT_IN_USE = 0x0019, "The object is in use.";
    NO_RESOURCES = 0x001D, "No resources are available.";
    INSUFFICIENT_BUFFER = 0x0033, "The buffer is too small.";
    INVALID_LP_INDEX = 0x0041, "The LP index does not name a logical processor.";
}

impl HvStatus {
    /// True for `HV_STATUS_SUCCESS`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// `Ok(())` for success, the error otherwise.
    ///
    /// # Errors
    /// Every status but `HV_STATUS_SUCCESS`.
    pub const fn result(self) -> HvResult<()> {
        match HvError::new(self) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// A failed hypercall's status: any `HV_STATUS` but success, so a result of type [`HvResult`]
/// cannot hold `Err(SUCCESS)`.
///
/// ```
/// use hvstats_abi::status::{HvError, HvStatus};
/// assert_eq!(HvError::new(HvStatus::SUCCESS), None);
/// assert_eq!(HvError::ACCESS_DENIED.status(), HvStatus::ACCESS_DENIED);
/// assert_eq!(HvStatus::ACCESS_DENIED.result(), Err(HvError::ACCESS_DENIED));
/// assert_eq!(HvStatus::from(HvStatus::SUCCESS.result()), HvStatus::SUCCESS);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HvError(NonZeroU16);

/// The result of a hypercall (or a step of one).
pub type HvResult<T> = Result<T, HvError>;

impl HvError {
    /// The error of a failure status; `None` for success.
    pub const fn new(status: HvStatus) -> Option<Self> {
        match NonZeroU16::new(status.0) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    const fn known(value: u16) -> Self {
        match NonZeroU16::new(value) {
            Some(v) => Self(v),
            None => panic!("HV_STATUS_SUCCESS is not an error"),
        }
    }

    /// The status a guest sees.
    pub const fn status(self) -> HvStatus {
        HvStatus(self.0.get())
    }
}

impl From<HvError> for HvStatus {
    fn from(e: HvError) -> Self {
        e.status()
    }
}

impl From<HvResult<()>> for HvStatus {
    fn from(r: HvResult<()>) -> Self {
        match r {
            Ok(()) => HvStatus::SUCCESS,
            Err(e) => e.status(),
        }
    }
}

impl fmt::Debug for HvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.status(), f)
    }
}

impl fmt::Display for HvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.status(), f)
    }
}

impl core::error::Error for HvError {}

impl fmt::Debug for HvStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}"),
            None => write!(f, "HV_STATUS({:#06x})", self.0),
        }
    }
}

impl fmt::Display for HvStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name(), self.message()) {
            (Some(name), Some(msg)) => write!(f, "{name} ({:#x}): {msg}", self.0),
            _ => write!(f, "unknown HV_STATUS {:#06x}", self.0),
        }
    }
}
