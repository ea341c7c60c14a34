//! (in progress)
use crate::error::Result;
use super::OverlayConfig;
pub struct OverlayFs;
impl OverlayFs {
    pub fn new(_cfg: &OverlayConfig) -> Result<Self> { Ok(OverlayFs) }
}
impl fuser::Filesystem for OverlayFs {}
