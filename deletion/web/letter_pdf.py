"""The reply letter as a PDF (fpdf2: pure Python, no system libraries).

A Unicode font is used when the system has DejaVu Sans (Debian's fonts-dejavu-core),
so names in any Latin, Greek or Cyrillic script print as entered; without it the
built-in Helvetica covers Latin-1 (English, German and most Western names), and a
name outside it is refused with a clear message rather than printed wrongly.
"""
from __future__ import annotations

from pathlib import Path

from fpdf import FPDF

from deletion.domain.errors import DomainError
from deletion.domain.services.letters import RenderedLetter

FONT_CANDIDATES = (Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),)
BOLD_CANDIDATES = (Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"),)


def _fonts(pdf: FPDF) -> str:
    regular = next((p for p in FONT_CANDIDATES if p.is_file()), None)
    bold = next((p for p in BOLD_CANDIDATES if p.is_file()), None)
    if regular is None:
        return "helvetica"
    pdf.add_font("letter", "", str(regular))
    pdf.add_font("letter", "B", str(bold or regular))
    return "letter"


def letter_pdf(letter: RenderedLetter, *, controller: str) -> bytes:
    pdf = FPDF(format="A4")
    pdf.set_title(letter.subject)
    pdf.set_author(controller)
    pdf.set_creator("erasure service")
    pdf.set_margins(22, 22, 22)
    pdf.set_auto_page_break(True, margin=22)
    pdf.add_page()
    family = _fonts(pdf)
    text = [letter.subject, *letter.paragraphs]
    if family == "helvetica":
        try:
            for part in text:
                part.encode("latin-1")
        except UnicodeEncodeError:
            raise DomainError("the letter holds characters the built-in PDF font cannot print; "
                              "install fonts-dejavu-core or print the HTML version") from None
    pdf.set_font(family, "", 9)
    pdf.set_text_color(90, 100, 115)
    pdf.cell(0, 5, controller, new_x="LMARGIN", new_y="NEXT")
    pdf.cell(0, 5, f"Reference {letter.reference}", new_x="LMARGIN", new_y="NEXT")
    pdf.ln(8)
    pdf.set_text_color(20, 25, 35)
    pdf.set_font(family, "B", 12)
    pdf.multi_cell(0, 6, letter.subject, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)
    pdf.set_font(family, "", 10.5)
    for paragraph in letter.paragraphs:
        pdf.multi_cell(0, 5.4, paragraph, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(3)
    return bytes(pdf.output())
