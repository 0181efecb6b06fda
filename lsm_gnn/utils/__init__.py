"""The bottom layer: helpers every other part may use and that import nothing of lsm_gnn above them.

- :mod:`.ids`: node ids as one tensor type, checked the same way everywhere;
- :mod:`.units`: byte sizes, with human strings ("4G") accepted;
- :mod:`.hashing`: splitmix64, the integer hash the native code, the kernels and Python share;
- :mod:`.fileio`: safe writes (a full disk named by file, atomic replaces, run locks);
- :mod:`.hostmem`: large host buffers on transparent huge pages;
- :mod:`.memcap`: a command run under a memory cap that counts the page cache;
- :mod:`.progress`: progress bars on a terminal only;
- :mod:`.timing`: wall-clock medians.
"""
