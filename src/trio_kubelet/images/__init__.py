"""Images: the image manager (pull policy, pull limit, credentials, backoff) and image GC."""
