//! The font the benches' plots draw their text with, read at run time (plotters'
//! `ab_glyph` backend has no fonts of its own).

use plotters::style::FontStyle;

pub const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers [`FONT`] as "sans-serif", or says how to get it.
pub fn load_font() -> Result<(), String> {
    let bytes = std::fs::read(FONT).map_err(|e| {
        format!("the plot needs the font {FONT} ({e}); install fonts-dejavu-core (Debian, Ubuntu)")
    })?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(bytes.into_boxed_slice()),
    )
    .map_err(|_| format!("{FONT} is not a font plotters can read"))
}
