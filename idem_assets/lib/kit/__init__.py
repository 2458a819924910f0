"""The rerun-safety kit's watchers: what an asset changes outside its IO managers."""
