/* SPDX-License-Identifier: MIT */
/* flashgrad/export.h - symbol visibility and C/C++ linkage macros.
 *
 * The library is built with -fvisibility=hidden; only declarations marked
 * FG_API are exported from libflashgrad.so. */
#ifndef FLASHGRAD_EXPORT_H
#define FLASHGRAD_EXPORT_H

#if defined(_WIN32)
#  if defined(FG_BUILDING_LIBRARY)
#    define FG_API __declspec(dllexport)
#  else
#    define FG_API
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define FG_API __attribute__((visibility("default")))
#else
#  define FG_API
#endif

#ifdef __cplusplus
#  define FG_BEGIN_DECLS extern "C" {
#  define FG_END_DECLS }
#else
#  define FG_BEGIN_DECLS
#  define FG_END_DECLS
#endif

#endif /* FLASHGRAD_EXPORT_H */
