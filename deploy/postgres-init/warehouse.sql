-- The warehouse's own database next to the instance's (POSTGRES_DB), created by the postgres
-- image when it initialises an empty data volume; its owner is the compose file's login.
CREATE DATABASE warehouse;
