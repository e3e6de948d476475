"""Who is asking and what they may spend: the keys file read and watched (``ring``: ``KeyRing``,
the request's ``Caller``), rate and token limits (``limits``), usage per key and day
(``usage``), the plane's one gate for all three (``access``), and whose prompt cache a request
may share (``cache_tenant``)."""
