"""LangGraph threads in transfers: their rows as the export format carries them
(``rows``), reading them from a store (``read``), storing incoming ones (``write``), and
their part of export, import and copy (``moves``)."""
