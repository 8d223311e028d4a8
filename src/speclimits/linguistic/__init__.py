"""The linguistic study (the appendix's second part; the book's methods page, "Linguistic labels").

:mod:`~speclimits.linguistic.align` (the one join of Oracle states to token rows: state ``pos``
drafts row ``pos + 1`` first),
:mod:`~speclimits.linguistic.labels` (rule-based context labels from token text),
:mod:`~speclimits.linguistic.contexts` (the Oracle's k* by context, response-clustered bootstrap),
:mod:`~speclimits.linguistic.routing` (new experts at script changes and at the first mismatch),
:mod:`~speclimits.linguistic.gallery` (decision panels, α = 0 cases, the stratified gallery),
:mod:`~speclimits.linguistic.study` (the study per reference kind: greedy headline, teacher-forced apart),
(the response-clustered bootstrap is :mod:`speclimits.bootstrap`, shared with the statistics and Delta Space).
"""

from speclimits.linguistic.align import alignment_check, require_convention, state_tokens, window_routing_check
from speclimits.linguistic.gallery import panel_data, select_ablation_cases, select_gallery
from speclimits.linguistic.contexts import (
    K_LONG, decision_table, k_by_context, k_star_shares, modal_advancement, write_decisions)
from speclimits.linguistic.labels import LabelAgreement, label_agreement, label_tokens, label_trace_tokens
from speclimits.linguistic.routing import (
    Contrast, first_mismatch_contrast, planted_contrast, routing_table, script_change_contrast)
from speclimits.linguistic.study import KindStudy, headline, paper_comparison, study_by_kind
from speclimits.vocabulary import BOUNDARY_LABELS, CONTEXTS, FINE_LABELS

__all__ = [
    "BOUNDARY_LABELS", "CONTEXTS", "Contrast", "FINE_LABELS", "K_LONG", "KindStudy", "LabelAgreement",
    "alignment_check", "decision_table", "first_mismatch_contrast", "headline", "k_by_context", "k_star_shares",
    "label_agreement", "label_tokens", "label_trace_tokens", "modal_advancement", "panel_data", "paper_comparison",
    "planted_contrast", "require_convention", "routing_table", "script_change_contrast", "select_ablation_cases",
    "select_gallery", "state_tokens", "study_by_kind", "window_routing_check", "write_decisions",
]
