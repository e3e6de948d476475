"""Which request runs where and when, within one model: its instances and slots (``pool``:
``ModelPool``), the weighted fair queue for slots (``fair_queue``), preemption of a heavy key's
generation for a waiting light one (``preempt``), the fair order of model loads
(``load_gate``) and prefix affinity (``prefixes``)."""
