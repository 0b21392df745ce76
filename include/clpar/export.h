/* export.h — symbol visibility for the public API.
 * The library is built with -fvisibility=hidden; only what carries CLPAR_API is exported. */
#ifndef CLPAR_EXPORT_H
#define CLPAR_EXPORT_H

#if defined(_WIN32)
#if defined(CLPAR_BUILDING)
#define CLPAR_API __declspec(dllexport)
#else
#define CLPAR_API __declspec(dllimport)
#endif
#else
#define CLPAR_API __attribute__((visibility("default")))
#endif

#endif
