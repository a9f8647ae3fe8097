"""Where media comes from: the SSRF fetch policy, the fetcher, offline reads (data URLs and
allowed files), the uniform fetch errors, and the worker processes that prepare media."""
