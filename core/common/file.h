/*
** Files the core reads: models, profiles, manifests, JSON, prompts. Only regular
** files are opened, so a FIFO, a device or a directory given as one is refused
** at once, naming it, instead of blocking on a FIFO's writer or reading forever.
*/
#ifndef TSR_FILE_H
#define TSR_FILE_H

#include <stdio.h>

#include "tessera/tessera.h"

/* path opened read-only (O_CLOEXEC) when it is a regular file; anything else is
** TSR_ERR_IO naming what it is. */
tsr_status tsr_file_open(const char *path, int *fd);
/* The same as a stdio stream ("rb"). */
tsr_status tsr_file_fopen(const char *path, FILE **f);

#endif
